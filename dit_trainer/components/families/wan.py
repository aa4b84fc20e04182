"""Wan 2.1 / 2.2 text-to-video: ``WanTransformer3DModel``, a DiT over (frame, row, column) patches of a video VAE's
latents (1 x 2 x 2 in the released models) that cross-attends to UMT5's hidden states of the prompt, with the
timestep alone in its modulation and 3-axis rotary positions.

``predict`` is WanPipeline's transformer call: the clip's latents (B, C, F, H, W) as they are, the raw timestep (0 to
1000, not divided), the caption's hidden states with no mask (Wan's conditioner zeroes the padding instead, as the
pipeline does). An image (B, C, H, W) is a clip of one frame, as Wan trains on images too; its prediction comes back
as an image.

A new model is sized by ``model.*`` and the conditioner: ``in_channels`` = the VAE's latent channels, ``text_dim`` the
conditioner's hidden size, patches of 1 x ``model.patch_size`` x ``model.patch_size`` (``model.extra_config.patch_size``
may give ``[t, p, p]``: a temporal patch of t frames), ``ffn_dim`` 4 x the width unless ``model.extra_config`` gives
it. Image-to-video switches (``image_dim``, ``added_kv_proj_dim``) are refused: this is the text-to-video family.

A released Wan is trained with flow matching at a fixed ``diffusion.shift`` (WanPipeline's scheduler: 3.0 at 480p,
5.0 at 720p); a new one may take another objective (the embedded example's v-prediction). Any VAE and text
conditioner train, but an export is a whole ``WanPipeline`` folder, which samples flow matching and holds Wan's UMT5
(``conditioner=wan``) and video autoencoder (``vae=wan``), taking prompts as text. DP-SGD is refused (``check``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from diffusers import WanPipeline, WanTransformer3DModel

from dit_trainer.components import VAE_KINDS
from dit_trainer.components.families.base import (
    ExportParts,
    Family,
    PipelineExport,
    features_mismatch,
    input_mismatch,
    require_flow_matching,
    require_further_arguments,
    require_guidance_of_at_least_one,
    save_with_encoder,
)
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import DataConfig, DiffusionConfig, ModelConfig, PrivacyConfig, VAEConfig
from dit_trainer.errors import ConfigError, require

# Constructor arguments the family sets from `model.*`, the VAE and the conditioner: not for `model.extra_config`.
DERIVED = frozenset(
    {"in_channels", "out_channels", "num_layers", "attention_head_dim", "num_attention_heads", "text_dim"}
)  # fmt: skip
# Image-to-video Wan's inputs (a CLIP image embedding, its key/value projections): a text-to-video model has none.
IMAGE_TO_VIDEO = {"image_dim": "a CLIP image embedding", "added_kv_proj_dim": "image key/value projections"}
# The self-attention (attn1) and cross-attention (attn2) projections and the feed-forward of every block: what Wan's
# LoRA trainers adapt (musubi-tuner, diffusion-pipe, ai-toolkit); the modulation tables stay frozen.
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2")
PIPELINE_FRAMES, PIPELINE_HEIGHT, PIPELINE_WIDTH = 81, 480, 832  # WanPipeline's defaults


def patch_size_of(config: Mapping) -> int | None:
    """Latents per token side: the spatial entries of Wan's (frames, rows, columns) ``patch_size``."""
    patch = config.get("patch_size")
    return None if patch is None else int(patch[-1])


def _patch(m: ModelConfig) -> tuple[int, int, int]:
    return tuple(m.extra_config.get("patch_size") or (1, m.patch_size, m.patch_size))


def _check_new(m: ModelConfig) -> None:
    """What a new Wan transformer needs of ``model.*``."""
    require_further_arguments(m, WanTransformer3DModel, DERIVED)
    for key, what in IMAGE_TO_VIDEO.items():
        require(
            not m.extra_config.get(key),
            f"model.extra_config.{key}",
            m.extra_config.get(key),
            f"it gives the transformer {what}, an input of image-to-video Wan, which this text-to-video family "
            "never feeds",
            f"remove `{key}` from `model.extra_config`",
        )
    patch = m.extra_config.get("patch_size")
    require(
        patch is None or (len(patch) == 3 and patch[1] == patch[2] == m.patch_size and patch[0] >= 1),
        "model.extra_config.patch_size",
        patch,
        f"Wan's patches are (frames, rows, columns) with rows = columns = `model.patch_size` ({m.patch_size}), "
        "which the resolution and bucket checks read",
        f"set e.g. `+model.extra_config.patch_size=[1,{m.patch_size},{m.patch_size}]`, or remove it",
    )
    head = m.attention_head_dim
    require(
        head % 2 == 0 and head >= 8,
        "model.attention_head_dim",
        head,
        "Wan's rotary positions split each head into three even parts (frame, row, column)",
        "set an even `model.attention_head_dim` of at least 8",
    )
    unused = {
        "learned_sigma": "Wan predicts the velocity alone, no variance",
        "cross_attention_dim": "Wan projects the text to its own width (heads x head_dim) before cross-attention",
        "dropout": "Wan's blocks have no dropout",
    }
    for key, why in unused.items():
        require(not getattr(m, key), f"model.{key}", getattr(m, key), why, f"remove `model.{key}` (its default)")


def check(
    model: ModelConfig, privacy: PrivacyConfig, vae: VAEConfig, data: DataConfig, diffusion: DiffusionConfig
) -> None:
    """Flow matching for a released model, no DP-SGD, and a new model's sizes and patches."""
    if model.pretrained is not None:
        require_flow_matching(
            diffusion,
            "Wan is trained with flow matching (its released weights predict the flow velocity)",
            "set `diffusion=flow` with Wan's fixed shift (`diffusion.shift=3.0` at 480p, 5.0 at 720p)",
        )
    require(
        not privacy.enabled,
        "privacy.enabled",
        privacy.enabled,
        "DP-SGD does not support WanTransformer3DModel: its query/key norms (RMSNorm across heads) and 3-D patch "
        "embedding are outside Opacus' layers, and per-sample gradients of a video batch would not fit a GPU",
        "set `privacy.enabled=false`, or use a PixArt family for private training",
    )
    if model.pretrained is None:
        _check_new(model)
        frames, temporal = data.frames, VAE_KINDS.get(vae.kind).temporal_factor
        latent_frames, patch = (frames - 1) // temporal + 1, _patch(model)[0]
        require(
            latent_frames % patch == 0,
            "model.extra_config.patch_size",
            list(_patch(model)),
            f"its temporal patch of {patch} latent frames does not divide the {latent_frames} latent frames of a "
            f"clip of `data.frames={frames}`" + (" (an image is a clip of one)" if frames == 1 else ""),
            "set a `data.frames` whose latent frames it divides, or a temporal patch of 1",
        )


def build(cfg: ModelConfig, in_channels: int, sample_size: int, condition: ConditionSize) -> WanTransformer3DModel:
    """A new transformer sized by ``model.*`` (see the module); ``sample_size`` is not the class's: it takes any."""
    extra = dict(cfg.extra_config)
    extra["patch_size"] = _patch(cfg)
    extra.setdefault("ffn_dim", 4 * cfg.num_attention_heads * cfg.attention_head_dim)
    return WanTransformer3DModel(
        in_channels=in_channels,
        out_channels=in_channels,
        num_layers=cfg.num_layers,
        attention_head_dim=cfg.attention_head_dim,
        num_attention_heads=cfg.num_attention_heads,
        text_dim=condition.sequence,
        **extra,
    )


def mismatch(config: dict, in_channels: int, condition: ConditionSize) -> str | None:
    for key, what in IMAGE_TO_VIDEO.items():
        if config.get(key):
            return f"it has `{key}` ({what}): it is an image-to-video Wan, and this family trains text-to-video"
    return features_mismatch(config, "text_dim", condition.sequence) or input_mismatch(config, in_channels)


def predict(
    transformer: WanTransformer3DModel, x_t: torch.Tensor, t: torch.Tensor, condition: Condition
) -> torch.Tensor:
    """WanPipeline's transformer call (see the module); an image is a one-frame clip."""
    clip = x_t if x_t.ndim == 5 else x_t.unsqueeze(2)
    prediction = transformer(
        hidden_states=clip,
        timestep=t.expand(len(x_t)),
        encoder_hidden_states=condition.sequence,
        return_dict=False,
    )[0]
    return prediction if x_t.ndim == 5 else prediction.squeeze(2)


def export(parts: ExportParts) -> PipelineExport:
    """A whole WanPipeline folder (transformer, Wan's VAE as it is, UMT5 and its tokenizer, the run's scheduler) that
    takes prompts as text and samples as our sampler does: its Euler grid at the run's fixed shift is ours."""
    require_guidance_of_at_least_one(parts.diffusion, "WanPipeline")
    require_flow_matching(
        parts.diffusion,
        "WanPipeline samples flow matching's velocity, and this run trained another objective",
        "train with `diffusion=flow` to export to WanPipeline (this run samples with `scripts/sample.py` as it is)",
    )
    for key, value in (("vae.kind", parts.vae_kind), ("conditioner.kind", parts.conditioner.kind)):
        if value != "wan":
            raise ConfigError(
                key,
                value,
                "a WanPipeline folder holds Wan's own video autoencoder (AutoencoderKLWan) and UMT5 text encoder, "
                "the ones it decodes and encodes prompts with",
                f"train with `{key.split('.')[0]}=wan` to export to WanPipeline (this run samples with "
                "`scripts/sample.py` as it is)",
            )
    generation = {
        "height": parts.data.resolution,
        "width": parts.data.resolution,
        "num_frames": parts.data.frames,
        "num_inference_steps": parts.diffusion.sample_steps,
        "guidance_scale": parts.diffusion.guidance_scale,
        "negative_prompt": "",
        "max_sequence_length": parts.conditioner.max_length,
    }
    defaults = {"height": PIPELINE_HEIGHT, "width": PIPELINE_WIDTH, "num_frames": PIPELINE_FRAMES}
    required = {key: generation[key] for key, default in defaults.items() if generation[key] != default}
    conditioning = {
        "bundled": True,
        "conditioning": "WanPipeline.encode_prompt: UMT5's last hidden states of the cleaned prompt "
        "(max_sequence_length tokens), zero past its real tokens, no mask; the empty prompt '' is the negative "
        "prompt of classifier-free guidance",
    }
    manifest = {"text_encoder": conditioning, "generation": generation, "required": required}
    conditioner = parts.text_encoder

    def save(folder: Path) -> None:
        save_with_encoder(parts, WanPipeline, conditioner.tokenizer, conditioner.model, folder)

    return PipelineExport(True, manifest, save, lambda folder: _usage(folder, parts, generation))


def _usage(folder: str, parts: ExportParts, generation: dict) -> str:
    """Python that loads the WanPipeline folder and writes a video as our sampler would."""
    settings = ", ".join(f"{key}={value!r}" for key, value in generation.items())
    cast = parts.dtype != "float32"
    return (
        ("import torch\n" if cast else "") + "from diffusers import WanPipeline\nfrom diffusers.utils import "
        f"export_to_gif\n\npipe = WanPipeline.from_pretrained({folder!r}"
        + (f", torch_dtype=torch.{parts.dtype}" if cast else "")
        + f')\nframes = pipe("a red circle moving left", {settings}).frames[0]\nexport_to_gif(frames, "video.gif")'
    )


WAN = Family(
    transformer_class=WanTransformer3DModel,
    build=build,
    mismatch=mismatch,
    predict=predict,
    pipeline="WanPipeline",
    export=export,
    check=check,
    input_layer="patch_embedding",
    lora_targets=LORA_TARGETS,
    blocks=("blocks",),
    pipeline_normalises=True,
    patch_size_of=patch_size_of,
    video=True,
)
