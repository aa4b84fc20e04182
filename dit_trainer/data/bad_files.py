"""Unreadable images are skipped by the data sources (``batch["bad_files"]``); this counts them (across processes,
in training) and stops when they are more than ``data.max_bad_fraction`` of the files read: a few corrupt files in a
scraped data set are normal, a mostly unreadable one (wrong path, wrong format) is not worth training on, nor worth
encoding into a cache, where every unreadable image's row would be a copy of a readable one."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator

from dit_trainer.condition import Batch
from dit_trainer.config import DataConfig
from dit_trainer.data.mixture import source_names
from dit_trainer.errors import ConfigError

MIN_BAD_TO_STOP = 5  # so that one unlucky corrupt file in the first batch never stops a run
SHOWN = 5


class BadFileCounter:
    """``sources``: the names of a mixture's data sets, whose skipped files (recorded as ``[name] ...``) are also
    counted apart, as ``data/skipped/<name>``. ``accelerator``: the training processes, whose counts are summed at
    every ``check`` (all of them call it at the same step); None: this process's alone (a cache's encoding).

    It keeps counts and the first few files, not every record: a long run over a scraped set skips many. A checkpoint
    keeps each process's counts (``state_dict``), so ``data/skipped`` goes on counting across a resume."""

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
        for record in records:
            self.per_source = [n + record.startswith(f"[{name}] ") for n, name in zip(self.per_source, self.sources)]
            if len(self.first) < SHOWN and record not in self.first:
                self.first.append(record)

    def check(self) -> dict[str, int]:
        """The counts so far (summed over the processes) -> ``{"data/skipped": n}``; raises ``ConfigError`` naming
        ``data.path`` (a mixture: ``data.mixture`` and its sources' skips) and the first bad files when there are
        too many."""
        counts = torch.tensor([self.bad, self.read, *self.per_source])
        if self.accelerator is not None:
            counts = self.accelerator.reduce(counts.to(self.accelerator.device), reduction="sum")
        bad, read, *per_source = (int(v) for v in counts)
        if bad >= MIN_BAD_TO_STOP and bad > self.max_bad_fraction * read:
            shown = "; ".join(self.first) or "(on other processes)"
            # a mixture's entries name their own paths (its `data.path` is unset): name the sources that skipped
            key, value, paths = ("data.path", self.data_path, "`data.path` points")
            if self.sources:
                skipped = {name: n for name, n in zip(self.sources, per_source) if n}
                key, value, paths = ("data.mixture", skipped, "the entries' paths point")
            raise ConfigError(
                key,
                value,
                f"{bad} of the {read} files read so far ({bad / read:.0%}) were unreadable and skipped, more than "
                f"`data.max_bad_fraction={self.max_bad_fraction:g}` allows; the first: {shown}",
                f"replace or remove the bad files (or their lines in the metadata), check that {paths} at the data "
                "you meant, or raise `data.max_bad_fraction`",
            )
        return {"data/skipped": bad} | {f"data/skipped/{name}": n for name, n in zip(self.sources, per_source)}

    def state_dict(self) -> dict[str, Any]:
        by_source = dict(zip(self.sources, self.per_source))
        return {"read": self.read, "bad": self.bad, "per_source": by_source, "first": self.first}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A source the checkpoint did not know (added to the mixture at the resume) starts at 0."""
        self.read, self.bad, self.first = state["read"], state["bad"], list(state["first"])
        self.per_source = [state["per_source"].get(name, 0) for name in self.sources]
