"""FLUX.1: ``FluxTransformer2DModel``, double-stream (MMDiT) blocks then single-stream blocks over the image's 2 x 2
latent patches and the T5 tokens, with a pooled CLIP vector and the timestep (and, guidance-distilled, the guidance
strength) in its modulation.

``predict`` does what FluxPipeline does around the transformer: it packs (B, C, H, W) latents into (B, HW/4, 4C)
tokens, builds the rotary position ids (row, column per image token; zeros per text token), passes the timestep
divided by 1000 and the pooled vector, and unpacks the velocity back to (B, C, H, W). Flux attends to every text
token, padding included (its pipeline passes no mask), so the condition's mask is not used.

A guidance-distilled model (``guidance_embeds``, FLUX.1-dev) gets ``model.embedded_guidance`` in its guidance
embedding in training and sampling (FluxPipeline's ``guidance_scale``); true classifier-free guidance is
``diffusion.guidance_scale`` (FluxPipeline's ``true_cfg_scale`` with ``negative_prompt=""``; 1 for FLUX.1-dev).

A new model is sized by ``model.*`` and the conditioner: ``in_channels`` = 4 x the VAE's latent channels (a token is
a 2 x 2 patch: ``model.patch_size`` must say 2), ``joint_attention_dim`` the conditioner's hidden size,
``pooled_projection_dim`` its pooled width; ``model.extra_config`` gives ``num_single_layers`` (default 2 x
``num_layers``, FLUX.1's ratio), ``guidance_embeds`` and ``axes_dims_rope`` (default: FLUX.1's proportions of
``attention_head_dim``).

The export (``families/mmdit_export.py``) is a ``FluxPipeline``: our CFG, ``uncond + s (cond - uncond)`` with the
empty prompt, is its ``true_cfg_scale=s`` with ``negative_prompt=""``, and its scheduler ships the run's shift
(Flux's resolution shift: ``use_dynamic_shifting``, mu from the image size).
"""

from __future__ import annotations

import torch
from diffusers import FluxTransformer2DModel

from dit_trainer.components.families import mmdit, mmdit_export
from dit_trainer.components.families.base import (
    ExportParts,
    Family,
    PipelineExport,
    require_extra_at_least,
    require_rope_axes,
)
from dit_trainer.components.families.mmdit import MMDiT
from dit_trainer.components.vae import known_downsample_factor
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, DataConfig, DiffusionConfig, ModelConfig, VAEConfig
from dit_trainer.errors import require

PACK = 2  # FluxPipeline packs 2 x 2 latents into one token
# The constructor arguments `model.*` and the conditioner decide; `model.extra_config` may give the others
# (num_single_layers, guidance_embeds, axes_dims_rope).
DERIVED = frozenset(
    {"patch_size", "in_channels", "out_channels", "num_layers", "attention_head_dim", "num_attention_heads",
     "joint_attention_dim", "pooled_projection_dim"}
)  # fmt: skip
FLUX_MMDIT = MMDiT(
    name="Flux",
    pipeline="FluxPipeline",
    kind="flux",
    encoders="CLIP-L + T5",
    pooled_by="modulation",
    transformer_class=FluxTransformer2DModel,
    derived=DERIVED,
    text_parts={"text_encoder": "clip", "tokenizer": "tokenizer", "text_encoder_2": "t5", "tokenizer_2": "tokenizer_2"},
    own_conditioning="FluxPipeline.encode_prompt: T5's last hidden states (max_sequence_length tokens, no mask, every "
    "token attended) and CLIP-L's pooled output (77 tokens); the empty prompt '' is the unconditional branch of "
    "classifier-free guidance (true_cfg_scale)",
    cfg_scale="true_cfg_scale",
)
# Both streams' attention and feed-forwards in the double blocks, and the single blocks' attention and MLP
# (diffusers' train_dreambooth_lora_flux with `--lora_layers` unset, plus the single blocks' proj_mlp).
LORA_TARGETS = (*mmdit.LORA_TARGETS, "proj_mlp")


def rope_axes(head_dim: int) -> tuple[int, int, int]:
    """The rotary dimensions of (unused index, row, column): FLUX.1's (16, 56, 56) of 128 in proportion, each even
    and summing to ``head_dim``."""
    side = 2 * ((head_dim - head_dim // 8) // 4)
    return head_dim - 2 * side, side, side


def _check_new(m: ModelConfig) -> None:
    """What a new Flux transformer needs of ``model.*``."""
    mmdit.check_new(FLUX_MMDIT, m)
    require_extra_at_least(m, "num_single_layers", 0, "the number of single-stream blocks after the double ones")
    require(
        m.patch_size == PACK,
        "model.patch_size",
        m.patch_size,
        "Flux packs 2 x 2 latents into one token (the resolution and bucket checks read it here)",
        "set `model.patch_size=2`",
    )
    require_rope_axes(m, "axes_dims_rope", "index, row, column", rope_axes)


def check(
    model: ModelConfig, vae: VAEConfig, conditioner: ConditionerConfig, data: DataConfig, diffusion: DiffusionConfig
) -> None:
    """Flux needs a pooled text vector, rectified flow and latents of even sides (2 x 2 packing)."""
    mmdit.check(
        FLUX_MMDIT,
        conditioner,
        diffusion,
        "set `diffusion=flow` (and `diffusion.resolution_shift=true` for Flux's own schedule)",
    )
    factor = known_downsample_factor(vae)
    if factor is not None and data.resolution % factor == 0:
        require(
            (data.resolution // factor) % PACK == 0,
            "data.resolution",
            data.resolution,
            f"Flux packs 2 x 2 latents into a token, so the latent side (resolution / {factor}) must be even",
            f"set `data.resolution` to a multiple of {factor * PACK}",
        )
    if model.pretrained is None:
        _check_new(model)


def build(cfg: ModelConfig, in_channels: int, sample_size: int, condition: ConditionSize) -> FluxTransformer2DModel:
    pooled = mmdit.pooled_width(FLUX_MMDIT, condition)
    extra = dict(cfg.extra_config)
    extra.setdefault("num_single_layers", 2 * cfg.num_layers)
    extra["axes_dims_rope"] = tuple(extra.get("axes_dims_rope") or rope_axes(cfg.attention_head_dim))
    return FluxTransformer2DModel(
        patch_size=1,  # the 2 x 2 patches are packed into channels by predict, as FluxPipeline does
        in_channels=in_channels * PACK * PACK,
        num_layers=cfg.num_layers,
        attention_head_dim=cfg.attention_head_dim,
        num_attention_heads=cfg.num_attention_heads,
        joint_attention_dim=condition.sequence,
        pooled_projection_dim=pooled,
        **extra,
    )


def mismatch(config: dict, in_channels: int, condition: ConditionSize) -> str | None:
    """An MMDiT's fit (``mmdit.mismatch``) to latents packed 2 x 2 into one token's channels."""
    return mmdit.mismatch(config, in_channels * PACK * PACK, condition)


def configure(transformer: FluxTransformer2DModel, cfg: ModelConfig) -> None:
    """The guidance strength ``predict`` feeds a guidance-distilled model (not a weight: the run's setting)."""
    transformer.embedded_guidance = cfg.embedded_guidance


def pack(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, HW/4, 4C): FluxPipeline's ``_pack_latents``."""
    b, c, h, w = latents.shape
    if h % PACK or w % PACK:
        raise ValueError(f"Flux packs 2 x 2 latents into a token: latents of {h} x {w} have an odd side")
    patches = latents.view(b, c, h // PACK, PACK, w // PACK, PACK).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(b, (h // PACK) * (w // PACK), c * PACK * PACK)


def unpack(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, HW/4, 4C) -> (B, C, H, W): FluxPipeline's ``_unpack_latents``."""
    b, _, channels = tokens.shape
    patches = tokens.view(b, height // PACK, width // PACK, channels // 4, PACK, PACK).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(b, channels // 4, height, width)


def image_ids(height: int, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(HW/4, 3) rotary ids (0, row, column) of the packed tokens: FluxPipeline's ``_prepare_latent_image_ids``,
    made on ``device`` (built on the CPU and copied, they would cost a host-device sync every forward)."""
    ids = torch.zeros(height // PACK, width // PACK, 3, device=device)
    ids[..., 1] = ids[..., 1] + torch.arange(height // PACK, device=device)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(width // PACK, device=device)[None, :]
    return ids.reshape(-1, 3).to(dtype=dtype)


def predict(
    transformer: FluxTransformer2DModel, x_t: torch.Tensor, t: torch.Tensor, condition: Condition
) -> torch.Tensor:
    """FluxPipeline's transformer call on packed ``x_t``, unpacked: timestep / 1000, every text token attended to."""
    batch, _, height, width = x_t.shape
    guidance = None
    if transformer.config.guidance_embeds:
        value = transformer.embedded_guidance
        guidance = torch.full([1], value, device=x_t.device, dtype=torch.float32).expand(batch)
    sequence = condition.sequence
    tokens = transformer(
        hidden_states=pack(x_t),
        timestep=t.expand(batch).to(x_t.dtype) / 1000,
        guidance=guidance,
        pooled_projections=condition.pooled,
        encoder_hidden_states=sequence,
        txt_ids=torch.zeros(sequence.shape[1], 3, device=x_t.device, dtype=sequence.dtype),
        img_ids=image_ids(height, width, x_t.device, x_t.dtype),
        return_dict=False,
    )[0]
    return unpack(tokens, height, width)


def export(parts: ExportParts) -> PipelineExport:
    """A ``FluxPipeline`` (see ``mmdit_export``): our CFG scale is its ``true_cfg_scale``, a guidance-distilled
    model's ``model.embedded_guidance`` its ``guidance_scale``."""
    guidance = {"guidance_scale": parts.model.embedded_guidance} if parts.transformer.config.guidance_embeds else {}
    return mmdit_export.export(parts, FLUX_MMDIT, guidance)


FLUX = Family(
    transformer_class=FluxTransformer2DModel,
    build=build,
    mismatch=mismatch,
    predict=predict,
    pipeline="FluxPipeline",
    export=export,
    check=check,
    configure=configure,
    input_layer="x_embedder",
    lora_targets=LORA_TARGETS,
    packing=PACK,
    blocks=("transformer_blocks", "single_transformer_blocks"),
    pipeline_applies_shift=True,
    resolution_shift=True,
)
