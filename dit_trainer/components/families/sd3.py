"""Stable Diffusion 3 and 3.5: ``SD3Transformer2DModel``, the MMDiT, whose image and text tokens attend jointly and
whose timestep embedding adds a pooled text vector (``pooled_projections``).

A new model is sized by ``model.*`` and the conditioner: ``joint_attention_dim`` is the conditioner's hidden size,
``pooled_projection_dim`` its pooled width, the caption projection maps to heads x head_dim (the joint attention's
width), and the positional table covers latents up to twice the run's latent size (aspect-ratio buckets).
``model.extra_config`` gives SD3.5's options (``qk_norm: rms_norm``, SD3.5-Medium's MMDiT-X ``dual_attention_layers``)
or a ``pos_embed_max_size`` of its own.

SD3 trains and samples rectified flow only (``diffusion=flow``): its weights predict the flow's velocity and its
pipeline expects ``FlowMatchEulerDiscreteScheduler``. It attends to every text token (the pipeline passes no mask),
so the condition's mask is not used. The export (``families/mmdit_export.py``) is a ``StableDiffusion3Pipeline``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from diffusers import SD3Transformer2DModel

from dit_trainer.components.families import mmdit, mmdit_export
from dit_trainer.components.families.base import (
    ExportParts,
    Family,
    PipelineExport,
    architecture,
    require_extra_at_least,
    require_extra_one_of,
    require_inner_cross_attention,
)
from dit_trainer.components.families.mmdit import MMDiT
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, DiffusionConfig, ModelConfig
from dit_trainer.errors import ConfigError, require

# The constructor arguments `model.*` and the conditioner decide; `model.extra_config` may give the others.
DERIVED = frozenset(
    {"sample_size", "patch_size", "in_channels", "out_channels", "num_layers", "attention_head_dim",
     "num_attention_heads", "joint_attention_dim", "caption_projection_dim", "pooled_projection_dim"}
)  # fmt: skip
TEXT_PARTS = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "text_encoder_3", "tokenizer_3")
SD3_MMDIT = MMDiT(
    name="SD3",
    pipeline="StableDiffusion3Pipeline",
    kind="sd3",
    encoders="CLIP-L + CLIP-G + T5",
    pooled_by="timestep embedding",
    transformer_class=SD3Transformer2DModel,
    derived=DERIVED,
    text_parts={name: name for name in TEXT_PARTS},  # the conditioner's attributes are the pipeline's names
    own_conditioning="StableDiffusion3Pipeline.encode_prompt: CLIP-L and CLIP-G penultimate hidden states (77 "
    "tokens) padded to T5's width, then T5's (max_sequence_length tokens), every token attended; pooled: both CLIPs' "
    "projected outputs; the empty prompt '' is the unconditional branch of classifier-free guidance",
)
# Both streams' attention and feed-forwards (MMDiT-X's second attention is attn2.to_*, which to_* covers).
LORA_TARGETS = mmdit.LORA_TARGETS


def _check_extra_config(m: ModelConfig) -> None:
    """SD3.5's options (their types checked by ``require_further_arguments``): MMDiT-X's dual attention in existing
    blocks, a qk norm diffusers knows, a positional table of at least one patch (``build`` checks it covers the
    latents, whose size the VAE decides)."""
    layers = m.extra_config.get("dual_attention_layers") or []
    require(
        all(0 <= i < m.num_layers for i in layers),
        "model.extra_config.dual_attention_layers",
        list(layers),
        f"block indices in 0 .. {m.num_layers - 1} (`model.num_layers={m.num_layers}`); diffusers ignores others",
        "list existing blocks, e.g. `[0, 1]`",
    )
    require_extra_one_of(m, "qk_norm", (None, "rms_norm", "layer_norm"), "SD3's attention (rms_norm: SD3.5)")
    require_extra_at_least(m, "pos_embed_max_size", 1, "the side of the positional table in patches")


def check(model: ModelConfig, conditioner: ConditionerConfig, diffusion: DiffusionConfig) -> None:
    """SD3 needs a pooled text vector and rectified flow; a new one has no learned variance, dropout or cross
    attention width of its own."""
    mmdit.check(SD3_MMDIT, conditioner, diffusion)
    m = model
    if m.pretrained is not None:
        return
    mmdit.check_new(SD3_MMDIT, m)
    require_inner_cross_attention(m, "SD3's text tokens join the image tokens' attention,")
    _check_extra_config(m)


def build(cfg: ModelConfig, in_channels: int, sample_size: int, condition: ConditionSize) -> SD3Transformer2DModel:
    pooled = mmdit.pooled_width(SD3_MMDIT, condition)
    inner = cfg.num_attention_heads * cfg.attention_head_dim
    extra = dict(cfg.extra_config)
    extra.setdefault("pos_embed_max_size", 2 * math.ceil(sample_size / cfg.patch_size))  # buckets up to 2:1
    if extra["pos_embed_max_size"] * cfg.patch_size < sample_size:
        raise ConfigError(
            "model.extra_config.pos_embed_max_size",
            extra["pos_embed_max_size"],
            f"the positional table must cover the latent size {sample_size} in patches of {cfg.patch_size}",
            f"set it to at least {math.ceil(sample_size / cfg.patch_size)}, or remove it (default: twice that)",
        )
    extra["dual_attention_layers"] = tuple(extra.get("dual_attention_layers") or ())
    arguments = architecture(cfg, in_channels, sample_size)  # `check` refuses a learned sigma and a dropout
    del arguments["dropout"]  # which SD3Transformer2DModel does not take
    return SD3Transformer2DModel(
        **arguments,
        joint_attention_dim=condition.sequence,
        caption_projection_dim=inner,
        pooled_projection_dim=pooled,
        **extra,
    )


def predict(
    transformer: SD3Transformer2DModel, x_t: torch.Tensor, t: torch.Tensor, condition: Condition
) -> torch.Tensor:
    """Every text token is attended to, padding included, as StableDiffusion3Pipeline does (no mask)."""
    return transformer(
        x_t,
        encoder_hidden_states=condition.sequence,
        pooled_projections=condition.pooled,
        timestep=t.expand(x_t.shape[0]),
        return_dict=False,
    )[0]


def export(parts: ExportParts) -> PipelineExport:
    """A ``StableDiffusion3Pipeline``: our CFG scale is its ``guidance_scale`` (see ``mmdit_export``)."""
    return mmdit_export.export(parts, SD3_MMDIT)


def largest_latent(config: Mapping) -> int:
    """The longest latent side SD3's positional table covers: ``pos_embed_max_size`` patches (diffusers' default
    96, SD3-Medium's 192)."""
    return config.get("pos_embed_max_size", 96) * config.get("patch_size", 2)


SD3 = Family(
    transformer_class=SD3Transformer2DModel,
    build=build,
    mismatch=mmdit.mismatch,
    predict=predict,
    pipeline="StableDiffusion3Pipeline",
    export=export,
    check=check,
    lora_targets=LORA_TARGETS,
    pipeline_applies_shift=True,
    largest_latent_of=largest_latent,
)
