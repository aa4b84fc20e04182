"""A training method that lives outside dit-trainer, as a user's own would: named by import path
(``trainer.method=toy_method:TOY_METHOD``), with no file of the package edited.

It trains on the data set's batches with the diffusion loss and counts the images it has trained on: a state of its
own that checkpoints keep and a resume restores (logged as ``toy/images_seen``). It owns a check of its config too.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader

from dit_trainer.components.build import Components
from dit_trainer.config import DataConfig, TrainerConfig
from dit_trainer.diffusion.loss import DiffusionLoss
from dit_trainer.errors import require
from dit_trainer.methods.base import Method
from dit_trainer.training.batches import resumable_batches
from dit_trainer.training.step import StepParts


class ImagesSeen:
    """The images every process has trained on, in all: the same number on every process."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.count = state["count"]


class CountingStep:
    """One update per step on the next batch (no accumulation), counting the images."""

    def __init__(self, loop: StepParts, loss_fn: DiffusionLoss, dataloader: DataLoader) -> None:
        self.loop = loop
        self.loss_fn = loss_fn
        self.dataloader = dataloader
        self.seen = ImagesSeen()

    def batches(self) -> Iterator[dict]:
        return resumable_batches(self.dataloader, self.loop.accelerator, self.loop.state.step)

    def __call__(self, batches: Iterator[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = next(batches)

        def backward() -> torch.Tensor:
            per_sample, _ = self.loss_fn(batch, self.loop.dit, self.loop.state.generator)
            self.seen.count += len(per_sample) * self.loop.accelerator.num_processes
            return self.loop.updates.update.backward(per_sample)

        return self.loop.updates.apply([backward])

    def metrics(self) -> dict[str, float]:
        return {"toy/images_seen": float(self.seen.count)}

    def saved_states(self) -> dict[str, ImagesSeen]:
        return {"toy_images_seen": self.seen}


class ToyMethod(Method):
    name = "toy"
    card_tag = "toy-method"

    def check(self, trainer: TrainerConfig) -> None:
        require(
            trainer.gradient_accumulation_steps == 1,
            "trainer.gradient_accumulation_steps",
            trainer.gradient_accumulation_steps,
            "the toy method takes one batch per update",
            "set `trainer.gradient_accumulation_steps=1`",
        )

    def describe(self) -> str:
        return "the toy method (diffusion loss, counting images)"

    def build_step(self, data: DataConfig, loop: StepParts, parts: Components, dataloader: DataLoader) -> CountingStep:
        loss_fn = DiffusionLoss(parts.vae, parts.text_encoder, parts.schedule, data.caption_dropout)
        return CountingStep(loop, loss_fn, dataloader)


TOY_METHOD = ToyMethod()
