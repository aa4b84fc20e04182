"""DiffusionNFT's old policy: a soft-updated copy of the trained parameters (the adapters under LoRA, all weights
otherwise) that rolls out and anchors the implicit policies. After every epoch old <- d old + (1 - d) trained, with
d growing from 0 (on-policy) to ``max_decay``: a trust region that widens as training settles."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class DecaySchedule:
    """d = min(``rate`` x (updates - ``flat``), ``max_decay``), and 0 for the first ``flat`` optimizer updates."""

    flat: int
    rate: float
    max_decay: float

    def __call__(self, updates: int) -> float:
        return 0.0 if updates < self.flat else min(self.rate * (updates - self.flat), self.max_decay)


class OldPolicy:
    """The old weights of ``parameters`` (the trained ones, as prepared), swapped in where the old policy acts.
    A checkpoint keeps them (``state_dict``: tensors, written as safetensors)."""

    def __init__(self, parameters: list[nn.Parameter], decay: DecaySchedule) -> None:
        self.parameters = parameters
        self.decay = decay
        self.weights = [parameter.detach().clone() for parameter in parameters]

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The old weights in the parameters' place (under no_grad), the trained ones back afterwards."""
        with torch.no_grad():
            trained = [parameter.detach().clone() for parameter in self.parameters]
            for parameter, old in zip(self.parameters, self.weights):
                parameter.copy_(old)
            try:
                yield
            finally:
                for parameter, weights in zip(self.parameters, trained):
                    parameter.copy_(weights)

    @torch.no_grad()
    def update(self, updates: int) -> float:
        """Move the old weights towards the trained ones after ``updates`` optimizer updates; returns the decay."""
        decay = self.decay(updates)
        for old, parameter in zip(self.weights, self.parameters):
            old.lerp_(parameter.detach(), 1 - decay)
        return decay

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {str(index): weights for index, weights in enumerate(self.weights)}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for index, weights in enumerate(self.weights):
            weights.copy_(state[str(index)])
