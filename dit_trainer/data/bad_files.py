"""Unreadable images are skipped by the data sources (``batch["bad_files"]``); this counts them and stops when they
are more than ``data.max_bad_fraction``: a few corrupt files in a scraped data set are normal, a mostly unreadable
one (wrong path, wrong format) is not worth training on, nor worth encoding into a cache, where every unreadable
image's row would be a copy of a readable one. Training counts the files its shuffled batches read, across
processes (``BadFileCounter``); a cache's in-order pass counts each file once against the whole data set
(``PassBadFiles``)."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import Dataset, IterableDataset

from dit_trainer.condition import Batch
from dit_trainer.config import DataConfig
from dit_trainer.data.mixture import source_names
from dit_trainer.errors import ConfigError

MIN_BAD_TO_STOP = 5  # so that one unlucky corrupt file in the first batch never stops a run
SHOWN = 5


def per_source(records: list[str] | dict[str, None], sources: list[str]) -> list[int]:
    """How many of ``records`` each of a mixture's ``sources`` skipped (their records read ``[name] ...``)."""
    return [sum(record.startswith(f"[{name}] ") for record in records) for name in sources]


def too_many(
    data_path: str | None, sources: list[str], skipped: list[int], counted: str, limit: float, first: list[str]
) -> ConfigError:
    """The refusal of too many unreadable files: ``counted`` says how many of how many; a mixture's entries name
    their own paths (its `data.path` is unset), so it names `data.mixture` and the ``skipped`` of each source."""
    key, value, paths = ("data.path", data_path, "`data.path` points")
    if sources:
        key, value = "data.mixture", {name: n for name, n in zip(sources, skipped) if n}
        paths = "the entries' paths point"
    return ConfigError(
        key,
        value,
        f"{counted}, more than `data.max_bad_fraction={limit:g}` allows; the first: "
        f"{'; '.join(first) or '(on other processes)'}",
        f"replace or remove the bad files (or their lines in the metadata), check that {paths} at the data you "
        "meant, or raise `data.max_bad_fraction`",
    )


class BadFileCounter:
    """The files a run's batches read, good or bad. ``sources``: the names of a mixture's data sets, whose skipped
    files are also counted apart, as ``data/skipped/<name>``. ``accelerator``: the training processes, whose counts
    are summed at every ``check`` (all of them call it at the same step) and in every checkpoint.

    It keeps counts and the first few files, not every record: a long run over a scraped set skips many. A
    checkpoint keeps the counts of all processes, which the resumed run's main process takes up (on any number of
    processes), so ``data/skipped`` counts on across a resume."""

    def __init__(
        self,
        max_bad_fraction: float,
        data_path: str | None,
        sources: list[str] = (),
        accelerator: Accelerator | None = None,
    ) -> None:
        self.accelerator = accelerator
        self.max_bad_fraction = max_bad_fraction
        self.data_path = data_path
        self.sources = list(sources)
        self.read = 0  # on this process: files read, good or bad
        self.bad = 0  # on this process
        self.per_source = [0] * len(self.sources)
        self.first: list[str] = []  # this process's first distinct records, which an error shows

    @classmethod
    def of(cls, data: DataConfig, accelerator: Accelerator | None = None) -> BadFileCounter:
        """The counter of the data section ``data``: its limit, path and mixture's names."""
        return cls(data.max_bad_fraction, data.path, source_names(data.mixture), accelerator)

    def add(self, batch: Batch) -> None:
        records = batch["bad_files"]
        self.read += len(batch["caption"]) + len(records)
        self.bad += len(records)
        self.per_source = [n + k for n, k in zip(self.per_source, per_source(records, self.sources))]
        new = [record for record in dict.fromkeys(records) if record not in self.first]
        self.first += new[: SHOWN - len(self.first)]

    def _totals(self) -> tuple[int, int, list[int]]:
        """(bad, read, per source) over every process (a collective: all of them call it together)."""
        counts = torch.tensor([self.bad, self.read, *self.per_source])
        if self.accelerator is not None:
            counts = self.accelerator.reduce(counts.to(self.accelerator.device), reduction="sum")
        bad, read, *skipped = (int(v) for v in counts)
        return bad, read, skipped

    def check(self) -> dict[str, int]:
        """The counts so far (summed over the processes) -> ``{"data/skipped": n}``; raises ``ConfigError`` naming
        ``data.path`` (a mixture: ``data.mixture`` and its sources' skips) and the first bad files when there are
        too many."""
        bad, read, skipped = self._totals()
        if bad >= MIN_BAD_TO_STOP and bad > self.max_bad_fraction * read:
            counted = f"{bad} of the {read} files read so far ({bad / read:.0%}) were unreadable and skipped"
            raise too_many(self.data_path, self.sources, skipped, counted, self.max_bad_fraction, self.first)
        return {"data/skipped": bad} | {f"data/skipped/{name}": n for name, n in zip(self.sources, skipped)}

    def state_dict(self) -> dict[str, Any]:
        """The counts of every process (written by each, taken up by the main one: see ``load_state_dict``)."""
        bad, read, skipped = self._totals()
        return {"read": read, "bad": bad, "per_source": dict(zip(self.sources, skipped)), "first": self.first}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The main process takes up the checkpoint's counts, the others start at 0: their sum is the checkpoint's
        on any number of processes. A source the checkpoint did not know (added to the mixture) starts at 0."""
        if self.accelerator is not None and not self.accelerator.is_main_process:
            return
        self.read, self.bad, self.first = state["read"], state["bad"], list(state["first"])
        self.per_source = [state["per_source"].get(name, 0) for name in self.sources]


class PassBadFiles:
    """The unreadable files of one in-order pass over a data set of ``total`` items (precompute, the in-memory
    latent cache), each counted once, against the whole data set. Such a pass reads them clustered (every unreadable
    header in the squarest bucket; a run of them tried as each other's stand-in), so a running fraction would stop
    it on data within the limit. It stops as soon as they are more than ``data.max_bad_fraction`` of ``total``
    (None, a stream's unknown length: at the end, of the files read)."""

    def __init__(self, data: DataConfig, total: int | None) -> None:
        self.data_path, self.sources = data.path, source_names(data.mixture)
        self.max_bad_fraction, self.total = data.max_bad_fraction, total
        self.files: dict[str, None] = {}  # an ordered set
        self.items = 0

    @classmethod
    def over(cls, data: DataConfig, dataset: Dataset) -> PassBadFiles:
        """The pass over ``dataset``, read with the data section ``data``."""
        return cls(data, None if isinstance(dataset, IterableDataset) else len(dataset))

    def add(self, batch: Batch) -> None:
        self.files.update(dict.fromkeys(batch["bad_files"]))
        self.items += len(batch["caption"])
        if self.total is not None:
            self._check(self.total)

    def finish(self) -> list[str]:
        """Every unreadable file once, after the last batch; raises when they are too many."""
        self._check(self.total if self.total is not None else self.items + len(self.files))
        return list(self.files)

    def _check(self, total: int) -> None:
        bad = len(self.files)
        if bad >= MIN_BAD_TO_STOP and bad > self.max_bad_fraction * total:
            counted = f"{bad} of the data set's {total} files ({bad / total:.0%}) are unreadable"
            first = list(self.files)[:SHOWN]
            skipped = per_source(self.files, self.sources)
            raise too_many(self.data_path, self.sources, skipped, counted, self.max_bad_fraction, first)
