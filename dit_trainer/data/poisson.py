"""Poisson-sampled batches, the sampling DP-SGD's privacy accounting assumes: every item is drawn independently at
every step, so a batch can also be empty."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

from dit_trainer.condition import Batch
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.seeded_items import item_key

EMPTY_BATCH_KEY = "empty"  # a Poisson draw can select no image: the step then adds noise to a zero gradient


class PoissonBatchSampler(Sampler[list[int]]):
    """Batches in which every index is drawn independently with probability ``1 / steps_per_epoch`` (so the
    expected size is ``num_samples / steps_per_epoch``): the sampling Opacus' accounting assumes.

    The draw of step ``s`` depends only on ``(seed, s)``: a resumed run (``next_step`` set to its step) draws
    exactly the batches the uninterrupted run would have, whatever the loader's workers prefetched. ``keyed``: the
    batches name their items by their ``SeededItems`` keys in round ``s``, so each item's random crop or flip is
    its step's too.
    """

    def __init__(self, num_samples: int, steps_per_epoch: int, seed: int, keyed: bool = False) -> None:
        self.num_samples = num_samples
        self.steps_per_epoch = steps_per_epoch
        self.seed = seed
        self.keyed = keyed
        self.next_step = 0

    @property
    def sample_rate(self) -> float:
        return 1 / self.steps_per_epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def indices(self, step: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        drawn = torch.rand(self.num_samples, generator=generator) < self.sample_rate
        return drawn.nonzero().flatten().tolist()

    def __iter__(self) -> Iterator[list[int]]:
        start = self.next_step
        for step in range(start, start + self.steps_per_epoch):
            self.next_step = step + 1
            indices = self.indices(step)
            yield [item_key(index, step, self.num_samples) for index in indices] if self.keyed else indices


def collate_poisson(items: list[dict[str, Any]]) -> dict[str, Any]:
    """``collate_batch``, and a marked empty batch for a draw that selected no image."""
    return collate_batch(items) if items else {EMPTY_BATCH_KEY: True, "bad_files": []}


def is_empty(batch: Batch) -> bool:
    return EMPTY_BATCH_KEY in batch
