"""Several data sets trained on as one (``data.mixture``): their items side by side, each tagged with its source, so
the batch plan can draw each epoch's items by the sources' weights and skipped files are counted per source."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from torch.utils.data import Dataset

from dit_trainer.config import DataConfig, MixtureSource
from dit_trainer.data.buckets import per_item


def source_names(mixture: list[MixtureSource]) -> list[str]:
    """Each entry's ``name``, or ``<source><position>`` (``imagefolder0``): what logs and metrics call it."""
    return [entry.name or f"{entry.source}{position}" for position, entry in enumerate(mixture)]


def entry_config(data: DataConfig, entry: MixtureSource) -> DataConfig:
    """``data`` for one entry alone: its source, path and columns, everything else shared."""
    return dataclasses.replace(
        data,
        source=entry.source,
        path=entry.path,
        split=entry.split,
        image_column=entry.image_column,
        caption_column=entry.caption_column,
        mixture=[],
    )


class MixtureDataset(Dataset):
    """The items of ``datasets`` one after the other; ``sources[i]`` is item ``i``'s data set. A skipped file's
    record names its source (``[name] file: reason``), so ``data/skipped/<name>`` can be counted."""

    def __init__(self, datasets: list[Dataset], names: list[str]) -> None:
        self.datasets, self.names = datasets, names
        self.offsets = [0, *accumulate(len(dataset) for dataset in datasets)]
        self.sources = [k for k, dataset in enumerate(datasets) for _ in range(len(dataset))]

    def __len__(self) -> int:
        return self.offsets[-1]

    def _locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        source = bisect.bisect_right(self.offsets, index) - 1
        return source, index - self.offsets[source]

    def image_size(self, index: int) -> tuple[int, int] | None:
        source, local = self._locate(index)
        return self.datasets[source].image_size(local)

    def item(
        self, index: int, size: tuple[int, int] | None = None, within: Sequence[int] | None = None
    ) -> dict[str, Any]:
        """Item ``index``; a skipped file is replaced from the same source (and from ``within``, sorted indices of
        this mixture, when given)."""
        source, local = self._locate(index)
        dataset, offset = self.datasets[source], self.offsets[source]
        if within is not None:
            end = self.offsets[source + 1]
            within = [i - offset for i in within[bisect.bisect_left(within, offset) : bisect.bisect_left(within, end)]]
        item = dataset.item(local, size, within) if hasattr(dataset, "item") else dataset[local]
        if item.get("bad_files"):
            item["bad_files"] = [f"[{self.names[source]}] {record}" for record in item["bad_files"]]
        return item

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.item(index)


def item_sources(dataset: Dataset) -> list[int] | None:
    """The source of each item of a mixture (or of a view of one: a subset, its buckets, its latent cache); None
    for a single source."""
    return per_item(dataset, "sources")
