"""The reference policy of GRPO's KL penalty: the weights the run started from. Full fine-tuning keeps a frozen
copy; under LoRA the reference is the same model with its adapters switched off (no second copy)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import torch
from torch import nn

from dit_trainer.components.lora import adapters_disabled


class ReferencePolicy:
    """``reference(x_t, t, condition)``: the starting model's prediction, under no_grad."""

    def __init__(self, model: nn.Module, context: Callable[[], contextlib.AbstractContextManager]) -> None:
        self.model = model
        self.context = context

    def __call__(self, *args) -> torch.Tensor:
        with torch.no_grad(), self.context():
            return self.model(*args)


def build_reference(dit: nn.Module, lora: bool, autocast: Callable[[], contextlib.AbstractContextManager]):
    """Built before training changes ``dit``: a frozen copy of it, or (LoRA) ``dit`` with adapters disabled.
    ``autocast`` is the run's mixed-precision context (a copy of the prepared model keeps accelerate's autocast
    forward, and this one adds nothing)."""
    if lora:
        return ReferencePolicy(dit, lambda: _both(autocast(), adapters_disabled(dit.transformer)))
    frozen = copy.deepcopy(dit).requires_grad_(False).eval()
    return ReferencePolicy(frozen, autocast)


@contextlib.contextmanager
def _both(first: contextlib.AbstractContextManager, second: contextlib.AbstractContextManager):
    with first, second:
        yield
