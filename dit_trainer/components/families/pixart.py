"""PixArt-α and PixArt-Σ: ``PixArtTransformer2DModel``, conditioned on text features by cross-attention.

The two share the transformer class and this module; they differ in their released weights (Σ: the SDXL VAE, 300
T5 tokens, no micro-conditions) and in the pipeline an export writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from diffusers import PixArtTransformer2DModel

from dit_trainer.components.families.base import Family, architecture, input_mismatch

if TYPE_CHECKING:
    from dit_trainer.config import ModelConfig


def build(cfg: ModelConfig, in_channels: int, sample_size: int, condition_dim: int) -> PixArtTransformer2DModel:
    return PixArtTransformer2DModel(
        **architecture(cfg, in_channels, sample_size),
        cross_attention_dim=cfg.cross_attention_dim or cfg.num_attention_heads * cfg.attention_head_dim,
        caption_channels=condition_dim,
        use_additional_conditions=False,
    )


def mismatch(config: dict, in_channels: int, condition_dim: int) -> str | None:
    if config["caption_channels"] != condition_dim:
        return f"it expects {config['caption_channels']}-dim text features while the text encoder gives {condition_dim}"
    return input_mismatch(config, in_channels)


def predict(
    transformer: PixArtTransformer2DModel,
    x_t: torch.Tensor,
    t: torch.Tensor,
    embeds: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """PixArt-α at 1024 px conditions on the image's pixel size and aspect ratio (``added_cond_kwargs``): the size
    of ``x_t`` (a bucket's, with buckets) x the SD VAE's factor 8 its weights were trained with."""
    added_cond_kwargs = {"resolution": None, "aspect_ratio": None}
    if transformer.config.use_additional_conditions:
        height, width = (size * 8 for size in x_t.shape[-2:])
        batch = x_t.shape[0]
        added_cond_kwargs = {
            "resolution": torch.tensor([[height, width]], device=x_t.device, dtype=x_t.dtype).repeat(batch, 1),
            "aspect_ratio": torch.tensor([[height / width]], device=x_t.device, dtype=x_t.dtype).repeat(batch, 1),
        }
    return transformer(
        x_t,
        encoder_hidden_states=embeds,
        encoder_attention_mask=mask,
        timestep=t.expand(x_t.shape[0]),
        added_cond_kwargs=added_cond_kwargs,
        return_dict=False,
    )[0][:, : x_t.shape[1]]


PIXART_ALPHA = Family(PixArtTransformer2DModel, build, mismatch, predict, "PixArtAlphaPipeline")
PIXART_SIGMA = Family(PixArtTransformer2DModel, build, mismatch, predict, "PixArtSigmaPipeline")
