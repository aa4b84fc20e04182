"""The supervised step (``trainer.method=sft``, the default): noise or velocity prediction on the data loader's
batches, one optimizer update over the update's micro-batches, the gradient-flow doctor before the first one."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader

from dit_trainer.condition import Batch
from dit_trainer.data.bad_files import BadFileCounter
from dit_trainer.data.collate import first_items
from dit_trainer.data.poisson import is_empty
from dit_trainer.training.batches import continued_micro_steps, data_position, resumable_batches
from dit_trainer.training.metrics import TimestepLossBuckets
from dit_trainer.training.preflight import PREFLIGHT_ROWS, preflight
from dit_trainer.training.state.saved_state import SavedState
from dit_trainer.training.step import StepParts

LossFn = Callable[[Batch, nn.Module, torch.Generator], tuple[torch.Tensor, torch.Tensor]]


class SupervisedStep:
    """``loss_fn`` (batch, DiT, generator -> (B,) loss and its timesteps) on ``dataloader``'s batches; each random
    draw from ``state``'s generator, so a resumed run draws what the uninterrupted one did."""

    def __init__(
        self,
        parts: StepParts,
        *,
        loss_fn: LossFn,
        dataloader: DataLoader,
        bad_files: BadFileCounter,
        num_train_timesteps: int,
        data_path: str | None = None,
    ) -> None:
        self.accelerator, self.dit, self.state, self.updates = parts.accelerator, parts.dit, parts.state, parts.updates
        self.loss_fn = loss_fn
        self.dataloader = dataloader
        self.bad_files = bad_files
        self.data_path = data_path  # named when a streamed data set yields nothing
        self.timestep_losses = TimestepLossBuckets(num_train_timesteps, self.state.since_log, self.accelerator.device)
        self._preflight_done = False
        self._micro_steps_read = 0

    def batches(self) -> Iterator[dict]:
        """Endless batches, continuing the data order where a resumed run stopped (in the state's data position,
        or after the steps' micro-batches)."""
        steps_read = self.state.step * self.updates.update.micro_batches
        self._micro_steps_read = continued_micro_steps(self.dataloader, steps_read, self.state.data_position)
        return resumable_batches(self.dataloader, self.accelerator, self._micro_steps_read, self.data_path)

    def __call__(self, batches: Iterator[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer update over the update's micro-batches; (loss, gradient norm)."""

        def micro_batches() -> Iterator[Callable[[], torch.Tensor]]:
            for _ in range(self.updates.update.micro_batches):
                batch = next(batches)
                self._micro_steps_read += 1
                self.state.data_position = data_position(self.dataloader, self._micro_steps_read)
                self.bad_files.add(batch)
                if not self._preflight_done and not is_empty(batch):
                    self._preflight(first_items(batch, PREFLIGHT_ROWS))
                yield functools.partial(self._backward, batch)

        return self.updates.apply(micro_batches())

    def metrics(self) -> dict[str, float]:
        """Unreadable files skipped, and the loss per timestep bucket since the last log step."""
        return self.bad_files.check() | self.timestep_losses.collect(self.accelerator)

    def saved_states(self) -> dict[str, SavedState]:
        """None: the data order resumes from the state's data position (``batches``), the randomness from the state's
        generator."""
        return {}

    def _backward(self, batch: Batch) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns its mean loss."""
        if is_empty(batch):  # only a Poisson draw (DP) can select no image
            return self.updates.update.backward_empty()
        per_sample, timesteps = self.loss_fn(batch, self.dit, self.state.generator)
        self.timestep_losses.add(per_sample, timesteps)
        return self.updates.update.backward(per_sample)

    def _preflight(self, batch: Batch) -> None:
        """The doctor on the first rows of this process's first batch, with a copy of the step's generator: the step
        that follows draws exactly what it would have drawn without the check."""
        model = self.accelerator.unwrap_model(self.dit)
        generator = torch.Generator(self.state.generator.device)
        generator.set_state(self.state.generator.get_state())

        def compute_loss() -> torch.Tensor:
            with self.accelerator.autocast():
                return self.loss_fn(batch, model, generator)[0].mean()

        with self.updates.update.diagnostics_paused():
            preflight(model, compute_loss)
        self._preflight_done = True
