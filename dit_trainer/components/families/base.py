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
    (latent channels, latent size) and whose conditioning input follows the text encoder's hidden size.
    ``mismatch(config, in_channels, condition_dim)``: why a loaded transformer's config does not fit the run
    (None when it does). ``predict``: the prediction for ``x_t`` at timesteps ``t``, ``x_t``'s channels only (a
    learned-variance half is the family's to drop). ``pipeline``: the diffusers pipeline class an export writes.
    """

    transformer_class: type[ModelMixin]
    build: Callable[[ModelConfig, int, int, int], ModelMixin]
    mismatch: Callable[[dict, int, int], str | None]
    predict: Callable[[ModelMixin, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    pipeline: str
    input_layer: str = "pos_embed.proj"  # the first layer the inputs meet: its dtype is the compute dtype
