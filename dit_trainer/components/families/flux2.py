"""FLUX.2 [klein]: ``Flux2Transformer2DModel`` (klein 4B: 5 double-stream then 20 single-stream blocks of 24 heads;
klein 9B: 8 and 24 of 32), over the tokens of FLUX.2's patched latents and Qwen3's hidden states of the prompt, with
4-axis rotary positions (time, row, column, text index) and the timestep (and, guidance-distilled, the guidance) in
modulations every block shares.

The latent is the VAE's (``vae=flux2``, ``PatchedVAE``): 2 x 2 patches of its 32 channels, 128 channels at 1/16 of
the image, normalised by its BatchNorm's statistics. ``predict`` does what Flux2KleinPipeline does around the
transformer: one token a latent position (``_pack_latents``), rotary ids (0, row, column, 0) per image token and
(0, 0, 0, index) per text token, the timestep divided by 1000, every text token attended to (the pipeline passes no
mask), and the tokens laid back on the latent grid.

A new model is sized by ``model.*`` and the conditioner: ``in_channels`` the VAE's patched channels
(``model.patch_size`` must say 1: the patches are the VAE's), ``joint_attention_dim`` the conditioner's width;
``model.extra_config`` gives ``num_single_layers`` (default 4 x ``num_layers``, klein 4B's ratio), ``mlp_ratio``,
``axes_dims_rope`` (default: a quarter of the head each), ``rope_theta`` and ``guidance_embeds`` (off: the klein
models are not guidance-distilled; on, ``model.embedded_guidance`` is fed as FLUX.1-dev's, and the export, whose
pipeline passes no guidance, is refused).

The pipeline shifts its noise levels by an empirical mu of the image's tokens and the step count:
``diffusion.resolution_shift=true`` with ``diffusion.resolution_shift_rule=flux2`` is that schedule (training's mu
at 50 steps), and the exported pipeline computes the same mu on the same grid; at a fixed ``diffusion.shift``
instead, an export hands the pipeline our sampler's noise levels (``sigmas``). The export is a whole
``Flux2KleinPipeline`` folder (its own Qwen3, prompts as text); our CFG is its ``guidance_scale`` (the same formula,
the empty prompt as the negative). DP-SGD is refused (``check`` says why).
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import Flux2KleinPipeline, Flux2Transformer2DModel

from dit_trainer.components.families.base import (
    ExportParts,
    Family,
    PipelineExport,
    bundled_usage,
    features_mismatch,
    input_mismatch,
    require_extra_at_least,
    require_flow_matching,
    require_further_arguments,
    require_guidance_of_at_least_one,
    sampler_generation,
    save_with_encoder,
)
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, DiffusionConfig, ModelConfig, PrivacyConfig, VAEConfig
from dit_trainer.errors import ConfigError, require

PIPELINE_SIZE = 1024  # Flux2KleinPipeline's default height and width
# Constructor arguments the family sets from `model.*`, the VAE and the conditioner: not for `model.extra_config`.
DERIVED = frozenset(
    {"patch_size", "in_channels", "out_channels", "num_layers", "attention_head_dim", "num_attention_heads",
     "joint_attention_dim"}
)  # fmt: skip
SINGLE_BLOCKS_AT_MOST = 48  # FLUX.2 [dev]'s single-stream blocks: the most any FLUX.2 has
# The double blocks' attention projections and feed-forwards of both streams, and the single blocks' fused
# query/key/value/MLP projection and output projection (diffusers' train_dreambooth_lora_flux2_klein defaults). A
# single block's `attn.to_out` is named in full: its ending is also that of the double blocks' output list, which peft
# cannot adapt (names past the model's depth match nothing, and peft lets them be).
LORA_TARGETS = (
    "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
    "ff.linear_in", "ff.linear_out", "ff_context.linear_in", "ff_context.linear_out", "to_qkv_mlp_proj",
    *(f"single_transformer_blocks.{i}.attn.to_out" for i in range(SINGLE_BLOCKS_AT_MOST)),
)  # fmt: skip


def rope_axes(head_dim: int) -> tuple[int, int, int, int]:
    """The rotary dimensions of (time, row, column, text index): FLUX.2's (32, 32, 32, 32) of 128 in proportion."""
    return (head_dim // 4,) * 4


def _check_new(m: ModelConfig) -> None:
    """What a new FLUX.2 transformer needs of ``model.*``."""
    require_further_arguments(m, Flux2Transformer2DModel, DERIVED)
    require_extra_at_least(m, "num_single_layers", 0, "the number of single-stream blocks after the double ones")
    require(
        m.patch_size == 1,
        "model.patch_size",
        m.patch_size,
        "FLUX.2's tokens are single latent positions: the 2 x 2 patches are the VAE's (`vae=flux2`)",
        "set `model.patch_size=1`",
    )
    unused = {
        "learned_sigma": "FLUX.2 predicts the velocity alone, no variance",
        "cross_attention_dim": "FLUX.2 attends to the caption within one joint sequence, with no cross-attention",
        "dropout": "FLUX.2's blocks have no dropout",
    }
    for key, why in unused.items():
        require(not getattr(m, key), f"model.{key}", getattr(m, key), why, f"remove `model.{key}` (its default)")
    head, given = m.attention_head_dim, m.extra_config.get("axes_dims_rope")
    require(
        sum(given) == head and len(given) == 4 and all(int(a) % 2 == 0 for a in given)
        if given is not None
        else head % 8 == 0,
        "model.extra_config.axes_dims_rope" if given is not None else "model.attention_head_dim",
        given if given is not None else head,
        f"each head splits into four even rotary parts (time, row, column, text index) that sum to {head}",
        f"set e.g. `+model.extra_config.axes_dims_rope=[{', '.join(map(str, rope_axes(head)))}]`"
        if given is not None
        else "set `model.attention_head_dim` to a multiple of 8",
    )


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
        "FLUX.2 is trained with flow matching (its released weights predict the flow velocity)",
        "set `diffusion=flow` (and `diffusion.resolution_shift=true diffusion.resolution_shift_rule=flux2` for "
        "FLUX.2's own schedule)",
    )
    require(
        conditioner.kind == "flux2",
        "conditioner.kind",
        conditioner.kind,
        "FLUX.2 [klein] is conditioned on three layers of Qwen3's hidden states of its chat-templated prompt "
        "(Flux2KleinPipeline's encoder), the one conditioner its pipeline and an export can hold",
        "use `conditioner=flux2`",
    )
    require(
        vae.kind == "flux2",
        "vae.kind",
        vae.kind,
        "FLUX.2's latents are its own autoencoder's in 2 x 2 patches, normalised by its BatchNorm's statistics (the "
        "ones Flux2KleinPipeline decodes)",
        "use `vae=flux2`",
    )
    require(
        not privacy.enabled,
        "privacy.enabled",
        privacy.enabled,
        "DP-SGD does not support Flux2Transformer2DModel: its modulations are computed once per forward outside "
        "the blocks and its query/key norms are diffusers' RMSNorm, outside Opacus' per-sample layers",
        "set `privacy.enabled=false`, or use a PixArt family for private training",
    )
    if model.pretrained is None:
        _check_new(model)


def build(cfg: ModelConfig, in_channels: int, sample_size: int, condition: ConditionSize) -> Flux2Transformer2DModel:
    """A new transformer sized by ``model.*`` (see the module); ``sample_size`` is not the class's: it takes any."""
    extra = dict(cfg.extra_config)
    extra.setdefault("num_single_layers", 4 * cfg.num_layers)
    extra.setdefault("guidance_embeds", False)
    extra["axes_dims_rope"] = tuple(extra.get("axes_dims_rope") or rope_axes(cfg.attention_head_dim))
    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=in_channels,
        num_layers=cfg.num_layers,
        attention_head_dim=cfg.attention_head_dim,
        num_attention_heads=cfg.num_attention_heads,
        joint_attention_dim=condition.sequence,
        **extra,
    )


def mismatch(config: dict, in_channels: int, condition: ConditionSize) -> str | None:
    if config.get("patch_size") != 1:
        return f"its patch size is {config.get('patch_size')}, and Flux2KleinPipeline feeds it single latent positions"
    return features_mismatch(config, "joint_attention_dim", condition.sequence) or input_mismatch(config, in_channels)


def configure(transformer: Flux2Transformer2DModel, cfg: ModelConfig) -> None:
    """The guidance strength ``predict`` feeds a guidance-distilled model (not a weight: the run's setting)."""
    transformer.embedded_guidance = cfg.embedded_guidance


def positions(height: int, width: int, text_length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary ids of the image tokens, (0, row, column, 0) in row-major order, and of the text tokens,
    (0, 0, 0, index): Flux2KleinPipeline's ``_prepare_latent_ids`` and ``_prepare_text_ids``, made on ``device``."""
    rows, columns = torch.meshgrid(
        torch.arange(height, device=device), torch.arange(width, device=device), indexing="ij"
    )
    image = torch.zeros(height * width, 4, device=device, dtype=torch.long)
    image[:, 1], image[:, 2] = rows.reshape(-1), columns.reshape(-1)
    text = torch.zeros(text_length, 4, device=device, dtype=torch.long)
    text[:, 3] = torch.arange(text_length, device=device)
    return image, text


def predict(
    transformer: Flux2Transformer2DModel, x_t: torch.Tensor, t: torch.Tensor, condition: Condition
) -> torch.Tensor:
    """Flux2KleinPipeline's transformer call: a token per latent position, timestep / 1000, every text token
    attended to; the tokens back on the (H, W) grid."""
    batch, channels, height, width = x_t.shape
    guidance = None
    if transformer.config.guidance_embeds:
        guidance = torch.full([1], transformer.embedded_guidance, device=x_t.device, dtype=torch.float32)
        guidance = guidance.expand(batch)
    image_ids, text_ids = positions(height, width, condition.sequence.shape[1], x_t.device)
    tokens = transformer(
        hidden_states=x_t.reshape(batch, channels, height * width).transpose(1, 2),
        timestep=t.expand(batch).to(x_t.dtype) / 1000,
        guidance=guidance,
        encoder_hidden_states=condition.sequence,
        txt_ids=text_ids,
        img_ids=image_ids,
        return_dict=False,
    )[0]
    return tokens.transpose(1, 2).reshape(batch, channels, height, width)


def export(parts: ExportParts) -> PipelineExport:
    """A whole Flux2KleinPipeline folder (transformer, its VAE as it is, Qwen3 and its tokenizer, the run's
    scheduler) that takes prompts as text."""
    if parts.transformer.config.guidance_embeds:
        raise ConfigError(
            "model.extra_config.guidance_embeds",
            True,
            "Flux2KleinPipeline calls the transformer without a guidance strength, and this one embeds "
            "`model.embedded_guidance` in every prediction: the pipeline would not sample as this run did",
            "export a klein model (no guidance embedding), or load the transformer into a Flux2Pipeline yourself",
        )
    require_guidance_of_at_least_one(parts.diffusion, "Flux2KleinPipeline")
    generation = sampler_generation(parts, guidance_scale=parts.diffusion.guidance_scale)  # the same CFG formula
    generation["max_sequence_length"] = parts.conditioner.max_length
    size = parts.data.resolution
    conditioning = {
        "bundled": True,
        "conditioning": "Flux2KleinPipeline.encode_prompt: Qwen3's hidden states of layers 9, 18 and 27 side by side, "
        "of the chat-templated prompt (thinking disabled) padded to max_sequence_length tokens, every token "
        "attended; the empty prompt '' is the negative of classifier-free guidance (guidance_scale)",
    }
    manifest = {
        "text_encoder": conditioning,
        "generation": generation,
        "required": {} if size == PIPELINE_SIZE else {"height": size, "width": size},
    }
    conditioner = parts.text_encoder

    def save(folder: Path) -> None:
        save_with_encoder(parts, Flux2KleinPipeline, conditioner.tokenizer, conditioner.model, folder)

    # (its first argument is a conditioning image: the prompt is named)
    return PipelineExport(True, manifest, save, lambda folder: bundled_usage(folder, parts, generation, "prompt="))


FLUX2 = Family(
    transformer_class=Flux2Transformer2DModel,
    build=build,
    mismatch=mismatch,
    predict=predict,
    pipeline="Flux2KleinPipeline",
    export=export,
    check=check,
    configure=configure,
    input_layer="x_embedder",
    lora_targets=LORA_TARGETS,
    blocks=("transformer_blocks", "single_transformer_blocks"),
    pipeline_normalises=True,
    resolution_shift=True,
    resolution_shift_rule="flux2",
)
