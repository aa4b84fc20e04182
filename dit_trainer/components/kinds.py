"""What a VAE kind and a conditioner kind (the entries of ``VAE_KINDS`` and ``CONDITIONER_KINDS``) tell the rest of
the package: how to build one, and what each needs of the config."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, VAEConfig


class Conditioner(Protocol):
    """What the DiT is conditioned on: ``encode(prompts) -> Condition`` (sequence, mask, pooled). A text encoder (or
    several) gives hidden states and a pooled vector, class labels give ids, a latent cache gives stored ones.
    ``size``: the widths a new transformer's conditioning inputs take."""

    @property
    def size(self) -> ConditionSize: ...

    @property
    def device(self) -> torch.device: ...

    def check_prompts(self, prompts: Sequence[str]) -> None: ...

    def encode(self, prompts: Sequence[str]) -> Condition: ...


@dataclass(frozen=True)
class VAEKind:
    """``build(cfg, device, dtype)``: the frozen VAE. ``downsample_factor(cfg, download)``: its factor before any
    model loads (None when only loading tells, unless ``download`` may fetch a config file). ``pretrained``: whether
    ``vae.pretrained`` names a model it loads. ``temporal_factor``: frames per latent frame after the first (1: an
    image autoencoder, which encodes a clip frame by frame), what `data.frames` must fit before any model loads."""

    build: Callable[[VAEConfig, torch.device, torch.dtype], Any]
    downsample_factor: Callable[[VAEConfig, bool], int | None]
    pretrained: bool = True
    temporal_factor: int = 1


@dataclass(frozen=True)
class ConditionerKind:
    """``build(cfg, device, dtype)``: the frozen conditioner. ``condition``: what it gives a family (``text``:
    hidden states, a mask and maybe a pooled vector; ``class``: class ids), matched against ``Family.condition``.
    ``check``: its own rules, on the config sections its parameters name (``config.call_with_sections``).
    ``pretrained``: whether ``conditioner.pretrained`` names a model it loads.
    ``instruction``: whether it puts ``conditioner.instruction`` before prompts, ``pooling``: whether it pools as
    ``conditioner.pooling`` says (set for any other, each is refused rather than silently ignored)."""

    build: Callable[[ConditionerConfig, torch.device, torch.dtype], Conditioner]
    condition: str = "text"
    check: Callable[..., None] | None = None
    pretrained: bool = True
    instruction: bool = False
    pooling: bool = False
