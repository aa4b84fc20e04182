"""The interface every transformer family implements (see ``dit_trainer.components.families``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from diffusers import ModelMixin

if TYPE_CHECKING:
    from dit_trainer.config import ModelConfig


@dataclass(frozen=True)
class Family:
    """One transformer family.

    ``build(cfg, in_channels, sample_size, condition_dim)``: a new transformer whose input follows the VAE
    (latent channels, latent size) and whose conditioning input follows the text encoder's hidden size (or, for
    class conditioning, the number of classes).
    ``mismatch(config, in_channels, condition_dim)``: why a loaded transformer's config does not fit the run
    (None when it does). ``predict``: the prediction for ``x_t`` at timesteps ``t``, ``x_t``'s channels only (a
    learned-variance half is the family's to drop). ``pipeline``: the diffusers pipeline class an export writes.
    """

    transformer_class: type[ModelMixin]
    build: Callable[[ModelConfig, int, int, int], ModelMixin]
    mismatch: Callable[[dict, int, int], str | None]
    predict: Callable[[ModelMixin, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    pipeline: str
    prepare: Callable[[ModelMixin], None] | None = None  # applied to every built or loaded transformer
    condition: str = "text"  # text: a text encoder's (embeds, mask) | class: class ids (text_encoder.kind=class_labels)
    input_layer: str = "pos_embed.proj"  # the first layer the inputs meet: its dtype is the compute dtype


def architecture(cfg: ModelConfig, in_channels: int, sample_size: int) -> dict:
    """The constructor arguments every DiT-style family shares: sizes from ``model.*``, input from the VAE, and
    twice the channels out with a learned variance."""
    return {
        "num_attention_heads": cfg.num_attention_heads,
        "attention_head_dim": cfg.attention_head_dim,
        "in_channels": in_channels,
        "out_channels": in_channels * (2 if cfg.learned_sigma else 1),
        "num_layers": cfg.num_layers,
        "dropout": cfg.dropout,
        "sample_size": sample_size,
        "patch_size": cfg.patch_size,
    }


def input_mismatch(config: dict, in_channels: int) -> str | None:
    """Why a loaded transformer does not take the VAE's latents (None when it does)."""
    if config["in_channels"] != in_channels:
        return f"it takes {config['in_channels']} input channels while the VAE gives {in_channels}"
    return None
