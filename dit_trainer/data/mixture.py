"""Several data sets trained on as one (``data.mixture``), skipped files counted per source: random-access ones side
by side, each item tagged with its source, so the batch plan can draw each epoch's items by the sources' weights;
with a stream among them (webdataset), one stream that draws each item's source by weight (``StreamMixture``)."""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset

from dit_trainer.config import DataConfig, MixtureSource
from dit_trainer.data.buckets import per_item
from dit_trainer.data.sources.streams import (
    process_rank_and_world_size,
    seeded_draws,
    seeded_int,
    seeded_uniform,
    worker_and_workers,
)
from dit_trainer.data.stream_changes import refuse_unless_allowed
from dit_trainer.errors import ConfigError


def source_names(mixture: list[MixtureSource]) -> list[str]:
    """Each entry's ``name``, or ``<source><position>`` (``imagefolder0``): what logs and metrics call it."""
    return [entry.name or f"{entry.source}{position}" for position, entry in enumerate(mixture)]


def source_keys(mixture: list[MixtureSource]) -> list[str]:
    """What identifies each entry across a resume: its source, path and split (and which repeat of them it is),
    not its place or name, so a saved stream position finds its sources when entries are added, removed or
    moved."""
    seen: Counter[str] = Counter()
    keys = []
    for entry in mixture:
        key = json.dumps([entry.source, entry.path, entry.split])
        seen[key] += 1
        keys.append(f"{key}#{seen[key]}")
    return keys


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
        item["source_index"] = item.get("source_index", local) + offset  # in this mixture's numbering
        if item.get("bad_files"):
            item["bad_files"] = [f"[{self.names[source]}] {record}" for record in item["bad_files"]]
        return item

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.item(index)


def mix(datasets: list[Dataset], data: DataConfig) -> Dataset:
    """The mixture of ``data.mixture``'s ``datasets``: a ``MixtureDataset`` of random-access ones, a
    ``StreamMixture`` when one of them is a stream."""
    names = source_names(data.mixture)
    if any(isinstance(dataset, IterableDataset) for dataset in datasets):
        weights = [entry.weight for entry in data.mixture]
        return StreamMixture(datasets, names, weights, data.seed, keys=source_keys(data.mixture))
    return MixtureDataset(datasets, names)


class StreamMixture(IterableDataset):
    """Data sets of which at least one is a stream, as one endless stream: each item's source is drawn by weight
    (from the seed, the rank, the worker and a counter), and each source goes through its own epochs, starting its
    next one when it runs out. A random-access source is read in a seeded order per epoch, split over ranks and
    workers as a stream's shards are. Its position (``MixedStream.state_dict``) is the draw counter and each
    source's own position, so a resumed run continues it exactly; ``keys`` (``source_keys``) match a saved
    position's sources to the configured ones (``resume_state``)."""

    def __init__(
        self,
        datasets: list[Dataset],
        names: list[str],
        weights: list[float],
        seed: int,
        rank: int | None = None,
        world_size: int | None = None,
        keys: list[str] | None = None,
    ) -> None:
        self.datasets, self.names, self.seed, self.keys = datasets, names, seed, keys or names
        self.shares = [weight / sum(weights) for weight in weights]
        default_rank, default_world_size = process_rank_and_world_size()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world_size if world_size is None else world_size

    def set_epoch(self, epoch: int) -> None:
        """Nothing: the mixture never ends, and each source counts its own epochs."""

    def __iter__(self) -> MixedStream:
        return MixedStream(self)

    def check_split(self, workers: int) -> None:
        """Refuse, in the main process before any worker starts, a source with fewer shards (or items) than
        processes x ``workers``: a worker without a share of it could never give the items its weight draws."""
        slots = self.world_size * max(workers, 1)
        for k, dataset in enumerate(self.datasets):
            shards = getattr(dataset, "shards", None)
            count, unit = (len(shards), "shards") if shards is not None else (len(dataset), "items")
            if count < slots:
                why = f"it has {count} {unit} for {self.world_size} processes x {max(workers, 1)} data-loader workers"
                raise no_share(self, k, f"{why}, so {slots - count} of them get no item of it")

    def resume_state(
        self, state: dict[str, Any], worker: int, workers: int, allow_change: bool
    ) -> tuple[dict[str, Any], list[str]]:
        """``state`` (``worker``'s ``MixedStream.state_dict``) with one entry per configured source, each matched to
        its saved one by key and checked as that source checks its own position; and what changed (refused unless
        ``allow_change``): a removed source is dropped, an added one starts at epoch 0, a changed one starts its
        saved epoch again. Draws continue by the configured weights, so a reweighted mixture takes effect as is."""
        saved_keys = state.get("keys") or (
            self.keys
            if len(state["sources"]) == len(self.keys)
            else [f"source {j}" for j in range(len(state["sources"]))]
        )
        saved_names = state.get("names", saved_keys)
        changes = [f"{name} removed" for key, name in zip(saved_keys, saved_names) if key not in self.keys]
        changes += [f"{self.names[k]} added" for k, key in enumerate(self.keys) if key not in saved_keys]
        refuse_unless_allowed("data.mixture", self.names, changes, allow_change)
        sources, read = [], []
        for k, key in enumerate(self.keys):
            if key not in saved_keys:
                sources.append({"epoch": 0})
                read.append(0)
                continue
            j = saved_keys.index(key)
            source, source_changes = self._source_state(k, state["sources"][j], worker, workers, allow_change)
            sources.append(source)
            read.append(0 if source_changes else state["read"][j])
            changes += [f"{self.names[k]}: {change}" for change in source_changes]
        return {
            "draws": state["draws"],
            "read": read,
            "sources": sources,
            "keys": self.keys,
            "names": self.names,
        }, changes

    def _source_state(
        self, k: int, saved: dict[str, Any], worker: int, workers: int, allow_change: bool
    ) -> tuple[dict[str, Any], list[str]]:
        dataset, key = self.datasets[k], f"data.mixture[{k}].path"
        if isinstance(dataset, IterableDataset):
            try:
                return dataset.resume_state(saved, worker, workers, allow_change)
            except ConfigError as error:
                raise (error.renamed(key) if error.key == "data.path" else error) from error
        items = saved.get("items", len(dataset))
        changes = [] if items == len(dataset) else [f"{items} items at the checkpoint, {len(dataset)} now"]
        refuse_unless_allowed(key, getattr(dataset, "path", None), changes, allow_change)
        return ({"epoch": saved["epoch"]} if changes else saved), changes


class MixedStream:
    """One worker's iterator of a ``StreamMixture``, with ``state_dict``/``load_state_dict`` (torchdata's
    ``Stateful``)."""

    def __init__(self, mixture: StreamMixture) -> None:
        self.mixture = mixture
        self.worker, workers = worker_and_workers()
        self.slot, self.slots = mixture.rank * workers + self.worker, mixture.world_size * workers
        self.draws = 0
        self.sources = [self._open(k, 0) for k in range(len(mixture.datasets))]
        self.read = [0] * len(self.sources)  # items each source gave in its current epoch

    def _open(self, k: int, epoch: int, seed: int | None = None):
        """Source ``k``'s stream for ``epoch``; a random-access one in the order of ``seed`` (default: the
        mixture's seed + ``k``; a restored position keeps the one it was saved with)."""
        dataset = self.mixture.datasets[k]
        if isinstance(dataset, IterableDataset):
            dataset.set_epoch(epoch)
            return iter(dataset)
        return MapShare(dataset, self.mixture.seed + k if seed is None else seed, epoch, self.slot, self.slots)

    def __iter__(self) -> MixedStream:
        return self

    def __next__(self) -> dict[str, Any]:
        self.draws += 1
        u = seeded_uniform(self.mixture.seed, self.mixture.rank, self.worker, self.draws)
        k = min(bisect.bisect_right(list(accumulate(self.mixture.shares)), u), len(self.sources) - 1)
        item = next(self.sources[k], None)
        if item is None:  # this source's epoch is over: its next one
            if self.read[k] == 0:
                split = f"it is split over {self.slots} processes x workers"
                raise no_share(self.mixture, k, f"a whole epoch of it gave worker {self.worker} no item ({split})")
            self.sources[k], self.read[k] = self._open(k, self.sources[k].epoch + 1), 0
            return self.__next__()
        self.read[k] += 1
        if item.get("bad_files"):
            item["bad_files"] = [f"[{self.mixture.names[k]}] {record}" for record in item["bad_files"]]
        return item

    def state_dict(self) -> dict[str, Any]:
        return {
            "draws": self.draws,
            "read": list(self.read),
            "sources": [s.state_dict() for s in self.sources],
            "keys": self.mixture.keys,
            "names": self.mixture.names,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state``, which has one entry per configured source (``StreamMixture.resume_state``)."""
        self.draws, self.read = state["draws"], list(state["read"])
        self.sources = [self._open(k, saved["epoch"], saved.get("seed")) for k, saved in enumerate(state["sources"])]
        for source, saved in zip(self.sources, state["sources"]):
            source.load_state_dict(saved)


def no_share(mixture: StreamMixture, k: int, why: str) -> ConfigError:
    """The one paragraph for source ``k`` of ``mixture`` that some process's worker has no share of."""
    return ConfigError(
        f"data.mixture[{k}].path",
        getattr(mixture.datasets[k], "path", None),
        f"the source {mixture.names[k]!r} must give every process's data-loader workers items, and {why}",
        "give it more shards (or images) than processes x `data.num_workers`, or lower `data.num_workers`",
    )


class MapShare:
    """A random-access data set read as a stream for one epoch: this rank's and worker's share of a permutation
    seeded by ``seed`` and ``epoch``. Each item is read with torch's random generator seeded by the item's place,
    so its random crop or flip is the same when a resumed run reads it."""

    def __init__(self, dataset: Dataset, seed: int, epoch: int, slot: int, slots: int) -> None:
        self.dataset, self.seed, self.epoch, self.position = dataset, seed, epoch, 0
        generator = torch.Generator().manual_seed(seeded_int(seed, epoch) >> 1)
        self.indices = torch.randperm(len(dataset), generator=generator)[slot::slots].tolist()

    def __iter__(self) -> MapShare:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.position >= len(self.indices):
            raise StopIteration
        index, self.position = self.indices[self.position], self.position + 1
        with seeded_draws(self.seed, self.epoch, index):
            return self.dataset[index]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "items": len(self.dataset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = state.get("position", 0)  # none: the epoch starts again (a changed or added source)


def item_sources(dataset: Dataset) -> list[int] | None:
    """The source of each item of a mixture (or of a view of one: a subset, its buckets, its latent cache); None
    for a single source."""
    return per_item(dataset, "sources")
