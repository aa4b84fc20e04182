"""What a VAE kind and a conditioner kind (the entries of ``VAE_KINDS`` and ``TEXT_ENCODER_KINDS``) tell the rest of
the package: how to build one, and what each needs of the config."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dit_trainer.config import TextEncoderConfig, TrainConfig, VAEConfig


class Conditioner(Protocol):
    """What the DiT is conditioned on: ``encode(prompts) -> (condition (B, ...), mask (B, L))``. A text encoder
    gives hidden states, class labels give ids, a latent cache gives stored embeddings."""

    @property
    def hidden_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def encode(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class VAEKind:
    """``build(cfg, device, dtype)``: the frozen VAE. ``downsample_factor(cfg, download)``: its factor before any
    model loads (None when only loading tells, unless ``download`` may fetch a config file). ``pretrained``: whether
    ``vae.pretrained`` names a model it loads."""

    build: Callable[[VAEConfig, torch.device, torch.dtype], Any]
    downsample_factor: Callable[[VAEConfig, bool], int | None]
    pretrained: bool = True


@dataclass(frozen=True)
class ConditionerKind:
    """``build(cfg, device, dtype)``: the frozen conditioner. ``condition``: what it gives a family (``text``:
    hidden states and a mask; ``class``: class ids), matched against ``Family.condition``. ``check(cfg)``: its own
    rules. ``pretrained``: whether ``text_encoder.pretrained`` names a model it loads."""

    build: Callable[[TextEncoderConfig, torch.device, torch.dtype], Conditioner]
    condition: str = "text"
    check: Callable[[TrainConfig], None] | None = None
    pretrained: bool = True
