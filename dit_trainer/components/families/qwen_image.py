"""Qwen-Image: ``QwenImageTransformer2DModel``, a 20.4 B-parameter MMDiT (60 double-stream blocks) over the image's
2 x 2 latent patches and Qwen2.5-VL's hidden states of the prompt, with 3-axis rotary positions (frame, row, column; the
text's positions continue past the image's) and the timestep alone in its modulation (no pooled vector).

``predict`` does what QwenImagePipeline does around the transformer: it packs (B, C, H, W) latents into (B, HW/4, 4C)
tokens (FluxPipeline's packing), passes the timestep divided by 1000, the caption with its mask (padding is masked
out) and the packed grid as ``img_shapes``, and unpacks the velocity back to (B, C, H, W).

A new model is sized by ``model.*`` and the conditioner: ``in_channels`` = 4 x the VAE's latent channels (a token is a
2 x 2 patch: ``model.patch_size`` must say 2), ``joint_attention_dim`` the conditioner's hidden size;
``model.extra_config`` may give ``axes_dims_rope`` (default: Qwen-Image's 16:56:56 proportions of the head). The
Edit and Layered variants' switches (``zero_cond_t``, ``use_additional_t_cond``, ``use_layer3d_rope``) and
``guidance_embeds`` (no released Qwen-Image has one) are refused.

Its conditioner is its own (``conditioner=qwen_image``: Qwen2.5-VL, the pipeline's template) and its VAE Qwen-Image's
video autoencoder on one-frame videos (``vae=qwen_image``), whose per-channel statistics the pipeline applies
itself. The export is a whole ``QwenImagePipeline`` folder that takes prompts as text. Its CFG (``true_cfg_scale=s``
with ``negative_prompt=""``) rescales each token's guided prediction, ``uncond + s (cond - uncond)``, to the norm of
its conditional one; ``guide`` does the same in our sampler, GRPO's rollouts and updates, so the pipeline reproduces
our samples at any scale. DP-SGD is refused (``check`` says why).
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import QwenImagePipeline, QwenImageTransformer2DModel

from dit_trainer.components.families.base import (
    ExportParts,
    Family,
    PipelineExport,
    bundled_usage,
    features_mismatch,
    input_mismatch,
    require_extra_one_of,
    require_flow_matching,
    require_further_arguments,
    require_guidance_of_at_least_one,
    require_rope_axes,
    sampler_generation,
    save_with_encoder,
)
from dit_trainer.components.families.flux import pack, rope_axes, unpack
from dit_trainer.components.families.mmdit import LORA_TARGETS as MMDIT_TARGETS
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, DiffusionConfig, ModelConfig, PrivacyConfig, VAEConfig
from dit_trainer.errors import require

PACK = 2  # QwenImagePipeline packs 2 x 2 latents into one token (the transformer's patch_size)
PIPELINE_SIZE = 1024  # QwenImagePipeline's default height and width
# Constructor arguments the family sets from `model.*`, the VAE and the conditioner: not for `model.extra_config`.
DERIVED = frozenset(
    {"patch_size", "in_channels", "out_channels", "num_layers", "attention_head_dim", "num_attention_heads",
     "joint_attention_dim"}
)  # fmt: skip
# Switches of Qwen-Image's other pipelines (Edit-2511, Layered) and an embedding no released model has: a
# text-to-image transformer keeps each off.
VARIANT_SWITCHES = {
    "zero_cond_t": "Qwen-Image-Edit's reference-image timestep",
    "use_additional_t_cond": "Qwen-Image-Layered's extra timestep condition",
    "use_layer3d_rope": "Qwen-Image-Layered's per-layer rotary positions",
    "guidance_embeds": "a guidance embedding, which no released Qwen-Image has (and diffusers' class cannot call)",
}
# Both streams' attention (the image's to_*, the text's add_*_proj / to_add_out) and both MLPs (img_mlp, txt_mlp):
# every linear layer of a block but its modulation, as ai-toolkit trains Qwen-Image LoRAs.
LORA_TARGETS = (
    *MMDIT_TARGETS[:8], "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2",
)  # fmt: skip


def _check_new(m: ModelConfig) -> None:
    """What a new Qwen-Image transformer needs of ``model.*``."""
    require_further_arguments(m, QwenImageTransformer2DModel, DERIVED)
    for key, what in VARIANT_SWITCHES.items():
        require_extra_one_of(m, key, (False,), f"a text-to-image Qwen-Image (`{key}` is {what})")
    require(
        m.patch_size == PACK,
        "model.patch_size",
        m.patch_size,
        "Qwen-Image packs 2 x 2 latents into one token (the resolution and bucket checks read it here)",
        f"set `model.patch_size={PACK}`",
    )
    unused = {
        "learned_sigma": "Qwen-Image predicts the velocity alone, no variance",
        "cross_attention_dim": "Qwen-Image attends to the caption within one joint sequence, with no cross-attention",
        "dropout": "Qwen-Image's blocks have no dropout",
    }
    for key, why in unused.items():
        require(not getattr(m, key), f"model.{key}", getattr(m, key), why, f"remove `model.{key}` (its default)")
    require_rope_axes(m, "axes_dims_rope", "frame, row, column", rope_axes)


def check(
    model: ModelConfig,
    privacy: PrivacyConfig,
    vae: VAEConfig,
    conditioner: ConditionerConfig,
    diffusion: DiffusionConfig,
) -> None:
    """Flow matching, its own conditioner and VAE (what its pipeline holds), no DP-SGD, and a new model's sizes."""
    require_flow_matching(
        diffusion,
        "Qwen-Image is trained with flow matching (its released weights predict the flow velocity)",
        "set `diffusion=flow` (and `diffusion.resolution_shift=true` for Qwen-Image's own schedule)",
    )
    require(
        conditioner.kind == "qwen_image",
        "conditioner.kind",
        conditioner.kind,
        "Qwen-Image is conditioned on Qwen2.5-VL's hidden states of its prompt template (QwenImagePipeline's "
        "encoder), the one conditioner its pipeline and an export can hold",
        "use `conditioner=qwen_image`",
    )
    require(
        vae.kind == "qwen_image",
        "vae.kind",
        vae.kind,
        "Qwen-Image's latents are those of its own video autoencoder (AutoencoderKLQwenImage, on one-frame videos), "
        "the one QwenImagePipeline decodes with",
        "use `vae=qwen_image`",
    )
    require(
        not privacy.enabled,
        "privacy.enabled",
        privacy.enabled,
        "DP-SGD does not support QwenImageTransformer2DModel: its query/key norms are diffusers' RMSNorm, outside "
        "Opacus' layers, and per-sample gradients of its 20 B parameters would not fit a GPU",
        "set `privacy.enabled=false`, or use a PixArt family for private training",
    )
    if model.pretrained is None:
        _check_new(model)


def build(
    cfg: ModelConfig, in_channels: int, sample_size: int, condition: ConditionSize
) -> QwenImageTransformer2DModel:
    """A new transformer sized by ``model.*`` (see the module); ``sample_size`` is not the class's: it takes any."""
    extra = dict(cfg.extra_config)
    extra["axes_dims_rope"] = tuple(extra.get("axes_dims_rope") or rope_axes(cfg.attention_head_dim))
    return QwenImageTransformer2DModel(
        patch_size=PACK,
        in_channels=in_channels * PACK * PACK,
        out_channels=in_channels,
        num_layers=cfg.num_layers,
        attention_head_dim=cfg.attention_head_dim,
        num_attention_heads=cfg.num_attention_heads,
        joint_attention_dim=condition.sequence,
        **extra,
    )


def mismatch(config: dict, in_channels: int, condition: ConditionSize) -> str | None:
    for key, what in VARIANT_SWITCHES.items():
        if config.get(key):
            return f"it has `{key}` ({what}): it is no text-to-image Qwen-Image transformer"
    if config.get("patch_size") != PACK:
        return f"its patch size is {config.get('patch_size')}, and QwenImagePipeline packs {PACK} x {PACK} latents"
    return features_mismatch(config, "joint_attention_dim", condition.sequence) or input_mismatch(
        config, in_channels * PACK * PACK
    )


def predict(
    transformer: QwenImageTransformer2DModel, x_t: torch.Tensor, t: torch.Tensor, condition: Condition
) -> torch.Tensor:
    """QwenImagePipeline's transformer call on packed ``x_t``, unpacked: timestep / 1000, the caption's padding
    masked out."""
    batch, _, height, width = x_t.shape
    tokens = transformer(
        hidden_states=pack(x_t),
        timestep=t.expand(batch).to(x_t.dtype) / 1000,
        encoder_hidden_states=condition.sequence,
        encoder_hidden_states_mask=condition.mask,
        img_shapes=[[(1, height // PACK, width // PACK)]] * batch,
        return_dict=False,
    )[0]
    return unpack(tokens, height, width)


def dead_ends(transformer: QwenImageTransformer2DModel) -> list[str]:
    """What only the last block's text output reads (the text's queries and their norm, the attention's text
    projection, the text MLP): the transformer keeps only the image tokens after it, so these get no gradient, or
    zeros."""
    last = f"transformer_blocks.{len(transformer.transformer_blocks) - 1}"
    return [f"{last}.attn.{name}" for name in ("add_q_proj", "norm_added_q", "to_add_out")] + [f"{last}.txt_mlp"]


def guide(cond: torch.Tensor, uncond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
    """QwenImagePipeline's CFG: the guided prediction of each token (a 2 x 2 patch of every channel) rescaled to the
    norm of the conditional one."""
    height, width = cond.shape[-2:]
    conditional, guided = pack(cond), pack(uncond + guidance_scale * (cond - uncond))
    norms = torch.linalg.vector_norm(conditional, dim=-1, keepdim=True) / torch.linalg.vector_norm(
        guided, dim=-1, keepdim=True
    )
    return unpack(guided * norms, height, width)


def export(parts: ExportParts) -> PipelineExport:
    """A whole QwenImagePipeline folder (transformer, its VAE as it is, Qwen2.5-VL and its tokenizer, the run's
    scheduler) that takes prompts as text."""
    require_guidance_of_at_least_one(parts.diffusion, "QwenImagePipeline")
    scale = parts.diffusion.guidance_scale  # its true_cfg_scale, with the empty prompt as the negative one
    negative = {"negative_prompt": ""} if scale > 1 else {}
    generation = sampler_generation(parts, true_cfg_scale=scale, **negative)
    generation["max_sequence_length"] = parts.conditioner.max_length
    size = parts.data.resolution
    required = {} if size == PIPELINE_SIZE else {"height": size, "width": size}
    conditioning = {
        "bundled": True,
        "conditioning": "QwenImagePipeline.encode_prompt: Qwen2.5-VL's last hidden states of the templated prompt "
        "past its 34-token system turn (max_sequence_length tokens), padding masked; the empty prompt '' is the "
        "negative prompt of classifier-free guidance (true_cfg_scale), whose guided prediction is rescaled per "
        "token to the conditional one's norm, as the run sampled",
    }
    manifest = {"text_encoder": conditioning, "generation": generation, "required": required}
    conditioner = parts.text_encoder

    def save(folder: Path) -> None:
        save_with_encoder(parts, QwenImagePipeline, conditioner.tokenizer, conditioner.model, folder)

    return PipelineExport(True, manifest, save, lambda folder: bundled_usage(folder, parts, generation))


QWEN_IMAGE = Family(
    transformer_class=QwenImageTransformer2DModel,
    build=build,
    mismatch=mismatch,
    predict=predict,
    pipeline="QwenImagePipeline",
    export=export,
    check=check,
    input_layer="img_in",
    lora_targets=LORA_TARGETS,
    dead_ends=dead_ends,
    guide=guide,
    pipeline_normalises=True,
    resolution_shift=True,
)
