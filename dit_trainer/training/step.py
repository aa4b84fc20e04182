"""The seam between the training loop and a training method: what a method does in one step of the loop.

The ``Trainer`` owns everything a step does not: the loop, logging, checkpoints, resume, monitors, preemption and
the run's end. A method's step owns where its inputs come from (``batches``: a data loader's batches, or the prompts
of a rollout epoch), what one step computes, what it adds to a log line, and the state of its own that a checkpoint
keeps. Every step turns its losses into updates with the same ``UpdateSequence``, so accumulation, clipping, the
non-finite guard, the optimizer step and the EMA are one code path for every method.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from accelerate import Accelerator
from diffusers.training_utils import EMAModel
from torch import nn

from dit_trainer.training.nonfinite import NonFiniteGuard
from dit_trainer.training.state.saved_state import SavedState
from dit_trainer.training.state.training_state import TrainingState
from dit_trainer.training.update import Update


class TrainingStep(Protocol):
    """One step of a training method, as the ``Trainer`` runs it."""

    def batches(self) -> Iterator[Any]:
        """The step's inputs, endless, continuing where a resumed run stopped."""

    def __call__(self, batches: Iterator[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """One step on the next of ``batches``: (loss, gradient norm), left on the device (reading them syncs)."""

    def metrics(self) -> dict[str, float]:
        """What the step adds to a log line, asked on every process at each log step (it may gather)."""

    def saved_states(self) -> dict[str, SavedState]:
        """The method's own state that a checkpoint keeps and a resume restores, by name: the same on every process
        (written once, as JSON, by the main process)."""


class UpdateSequence:
    """The one sequence every step runs to apply its losses: each backward pass under the ``update``'s accumulation,
    then, once the gradients are complete, their norm, the non-finite ``guard`` and the optimizer step; the ``ema``
    follows an applied update."""

    def __init__(self, update: Update, guard: NonFiniteGuard, ema: EMAModel | None) -> None:
        self.update = update
        self.guard = guard
        self.ema = ema

    def apply(self, backward_passes: Iterable[Callable[[], torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``backward_passes`` (each does its forward and backward and returns its mean loss, detached) as one
        update; returns (mean loss, gradient norm)."""
        update = self.update
        losses, grad_norm, finite = [], torch.tensor(float("nan")), True
        for backward in backward_passes:
            with update.accumulate():
                losses.append(backward())
                if update.sync_gradients:
                    grad_norm = update.norm_before_step()
                    finite = self.guard.check(torch.stack(losses).mean(), grad_norm)
                    grad_norm = update.step(grad_norm, finite)
        if finite and self.ema is not None:
            self.ema.step(update.parameters)
        return torch.stack(losses).mean(), grad_norm


@dataclass(frozen=True)
class StepParts:
    """What the composition root gives every method's step: the accelerator, the prepared DiT, the checkpointed
    state (step count and generator) and the update sequence."""

    accelerator: Accelerator
    dit: nn.Module
    state: TrainingState
    updates: UpdateSequence
