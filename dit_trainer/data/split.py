"""The validation data of a run: a seeded held-out split of a random-access data set, or a data set of its own.

The split is a function of the data set's length and the seed alone, so every process, a resumed run and a later
evaluation hold out the same items, and no held-out item is ever in the training subset. It is drawn over the
source's items; a latent cache, whose rows precompute may have written in another order (bucket by bucket, or a
share per process), holds out the rows of those same items. Each side of the split replaces an unreadable item with
the next readable one of its own side.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from dit_trainer.config import DataConfig, ValidationConfig
from dit_trainer.data import SOURCES
from dit_trainer.data.buckets import Bucketed, BucketTable, bucketed
from dit_trainer.data.cache.cache import CacheDataset
from dit_trainer.data.sources.source import build_dataset
from dit_trainer.errors import require


class SplitSide(Subset):
    """One side of the held-out split (what is trained on, or what is validated): ``indices`` of ``dataset``, sorted.
    An unreadable item's replacement comes from this side too, so no image crosses the split."""

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not hasattr(self.dataset, "item"):  # a cache or a procedural source: nothing is unreadable
            return self.dataset[self.indices[index]]
        return self.dataset.item(self.indices[index], within=self.indices)

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]] | dict[str, Any]:
        if callable(getattr(self.dataset, "__getitems__", None)):  # a cache gathers a batch at once
            return self.dataset.__getitems__([self.indices[index] for index in indices])
        return [self[index] for index in indices]


def held_out_count(length: int, fraction: float) -> int:
    """At least one item, and at least one left to train on."""
    return min(max(1, round(length * fraction)), length - 1)


def split_indices(length: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(training indices, held-out indices): ``fraction`` of ``range(length)`` drawn by a permutation seeded with
    ``seed``, each list in ascending order (so a cached or shuffled read stays as it would be)."""
    order = torch.randperm(length, generator=torch.Generator().manual_seed(seed))
    held_out = order[: held_out_count(length, fraction)]
    keep = torch.ones(length, dtype=torch.bool)
    keep[held_out] = False
    return keep.nonzero().flatten().tolist(), sorted(held_out.tolist())


def unaugmented(data: DataConfig, path: str | None) -> DataConfig:
    """``data`` read without augmentation (no random crop, no flip, the first caption column, no shuffle) from
    ``path``: validation must see the same images every time."""
    return dataclasses.replace(
        data,
        path=path,
        crop="center" if data.crop == "random" else data.crop,
        horizontal_flip=False,
        caption_column=(data.caption_columns or [data.caption_column])[0],
        caption_columns=[],
        shuffle_buffer=0,
    )


def split_validation(
    data: DataConfig, validation: ValidationConfig, dataset: Dataset, table: BucketTable | None = None
) -> tuple[Dataset, Dataset | None]:
    """(the data to train on, the validation data or None without validation): ``validation.split`` of
    ``dataset`` (the source, bucketed by ``table`` when given, or its latent cache), or the data at
    ``validation.path``, validated at the sizes of the same buckets."""
    if not validation.every_n_steps:
        return dataset, None
    if validation.path:
        held_out = build_dataset(unaugmented(data, validation.path))
        if SOURCES.get(data.source).streamed:  # validated on the main process alone: every shard, not 1/N of them
            held_out = held_out.unsharded()
        return dataset, bucketed(held_out, table, validation.batch_size)
    require(
        len(dataset) >= 2,
        "validation.split",
        validation.split,
        f"the data set holds {len(dataset)} item(s), and a split needs one to hold out and one to train on",
        "add images, validate on data of its own (`validation.path=...` with `validation.split=0`), or turn "
        "validation off (`validation.every_n_steps=0`)",
    )
    train, held_out = split_indices(len(dataset), validation.split, validation.seed)
    if isinstance(dataset, CacheDataset):  # its rows of the held-out source items, which may lie anywhere
        train, held_out = dataset.rows_of(train), dataset.rows_of(held_out)
        return SplitSide(dataset, train), SplitSide(dataset, held_out)
    plain = build_dataset(unaugmented(data, data.path))
    if isinstance(dataset, Bucketed):  # the same buckets, not read again
        plain = Bucketed(plain, dataset.table, dataset.buckets)
    return SplitSide(dataset, train), SplitSide(plain, held_out)


def validation_images(data: DataConfig, validation: ValidationConfig) -> Dataset | None:
    """The held-out images themselves (never a latent cache's posteriors), centre-cut to ``resolution`` squares as
    FID's protocol has it (and as samples are generated): what FID compares samples with."""
    return split_validation(data, validation, build_dataset(unaugmented(data, data.path)))[1]
