"""One worker's resumable pass over its tar shards for one epoch (``ShardStream``), and the reading of one shard.

Shards are read in sequence with the standard library's ``tarfile`` (one pass, no index), so a broken member or a
truncated tar is skipped and reported exactly where it happens. ``webdataset`` supplies the key convention only.
"""

from __future__ import annotations

import logging
import tarfile
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from PIL import Image
from webdataset.tariterators import base_plus_ext

from dit_trainer.data.sources.streams import seeded_index, seeded_int, worker_and_workers
from dit_trainer.data.sources.transforms import UNREADABLE_ERRORS, describe_failure
from dit_trainer.data.stream_changes import Fingerprint, list_key, shard_fingerprint
from dit_trainer.errors import ConfigError

logger = logging.getLogger(__name__)


class ShardSource(Protocol):
    """What a ``ShardStream`` reads of its source (``webdataset.WebDatasetSource``): the shards and how they are
    split, decoded, augmented and shuffled."""

    path: str
    shards: list[str]
    epoch: int
    seed: int
    rank: int
    shuffle_buffer: int

    def assigned_shards(self, epoch: int | None = None) -> list[str]: ...

    def decode(self, members: dict[str, bytes], generator: torch.Generator | None = None) -> tuple[Any, str]: ...

    def pixels(
        self, decoded: Any, size_of: Callable[[Image.Image], tuple[int, int]], generator: torch.Generator
    ) -> torch.Tensor: ...


def read_shard(shard: str, bad: list[str], start: int = 0) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {extension: bytes})`` per sample in tar order, from the ``start``-th sample on: the samples before it
    are passed over by their headers, their bytes never read into a sample (a resumed stream's skip). A tar that is
    cut off or corrupt (or lacks the end-of-archive marker that every tar writer ends with) ends here with one record
    appended to ``bad``; the samples before the damage are still yielded."""
    key, members, index = None, {}, -1
    try:
        with tarfile.open(shard, mode="r|*") as tar:
            for info in tar:
                prefix, extension = base_plus_ext(info.name) if info.isfile() else (None, None)
                if prefix is None:
                    continue
                if prefix != key:
                    if members:
                        yield key, members
                        members = {}
                    key, index = prefix, index + 1
                if index >= start:
                    members[extension.lower()] = tar.extractfile(info).read()
                tar.members = []  # a stream-mode TarFile otherwise keeps every header it has read
            # The loop ends quietly where the data ends or a header is damaged, as it does at the end-of-archive
            # marker (two zero blocks, the first read by the loop): a copy cut off at a block boundary would lose
            # its last samples unreported.
            marker = tar.fileobj.read(tarfile.BLOCKSIZE)
            if marker.count(0) != tarfile.BLOCKSIZE:
                raise tarfile.ReadError(
                    "no end-of-archive marker where the samples end: cut off, or a header is damaged"
                )
    except (tarfile.TarError, OSError, EOFError) as error:
        bad.append(describe_failure(shard if key is None else f"{shard}:{key}", error))
        return
    if members:
        yield key, members


Ref = tuple[int, int]  # a sample's place: (its shard's position in a worker's shard list, its position in the tar)
Sample = tuple[Ref, str, dict[str, bytes]]  # (place, key, members still encoded)


class ShardStream:
    """One worker's pass over its shards for one epoch, as an iterator whose position can be saved and restored
    (torchdata's ``Stateful``: ``StatefulDataLoader`` keeps it per worker and ``stream_loader`` per process).

    Samples go through a shuffle buffer of ``shuffle_buffer`` samples (tar order puts similar images together: one
    crawl, one source, and a batch of neighbours is a biased one) whose draws depend only on the seed, the epoch,
    the rank, the worker and a counter. The position is the next sample's place, the draw counter and the places
    of the samples in the buffer, so a restored stream opens one shard at its place (passing over earlier samples
    by their tar headers: nothing before is decoded) and re-reads only the buffered samples' bytes. Random crops,
    flips and captions draw from a generator seeded by the sample itself, so a re-read sample is the same item.

    The state also says what the position is valid for: the worker's shard list and the fingerprints of the shards
    it reads again, which ``WebDatasetSource.resume_state`` compares with the files before a resume
    (``stream_changes``).

    Each item is held back until the next readable one is decoded, so records of unreadable samples after the last
    good one still reach the trainer (on that last item) instead of being lost when the stream ends.
    """

    def __init__(self, source: ShardSource, size_of: Callable[[Image.Image], tuple[int, int]]) -> None:
        self.source, self.size_of = source, size_of
        self.worker = worker_and_workers()[0]
        self._start(source.epoch)

    def _start(self, epoch: int) -> None:
        self.epoch = epoch
        self.shards = self.source.assigned_shards(epoch)
        self.shards_key = list_key(self.shards)  # the state says which list its places index into
        self.next: Ref = (0, 0)  # the next sample to read
        self.draws = 0
        self.draining = False  # every shard read: the buffer empties
        self.buffer: list[Sample] = []
        self.held: tuple[Ref, dict[str, Any]] | None = None
        self.bad: list[str] = []  # records not yet attached to an item
        self._reader: Iterator[tuple[str, dict[str, bytes]]] | None = None
        self.fingerprints: dict[str, Fingerprint] = {}  # of the shards opened this epoch, by path

    def __iter__(self) -> ShardStream:
        return self

    def __next__(self) -> dict[str, Any]:
        while (sample := self._next_sample()) is not None:
            ref, key, members = sample
            try:  # the transform too: an image can decode and still fail to convert
                item = self._item(ref, key, members)
            except UNREADABLE_ERRORS as error:
                self.bad.append(describe_failure(f"{self.shards[ref[0]]}:{key}", error))
                continue
            if self.bad:
                item["bad_files"], self.bad = self.bad, []
            previous, self.held = self.held, (ref, item)
            if previous is not None:
                return previous[1]
        if self.held is None:
            if self.bad:
                shown = "; ".join(self.bad)
                logger.warning("this worker read no image, only %d unreadable samples: %s", len(self.bad), shown)
                self.bad = []
            raise StopIteration
        item, self.held = self.held[1], None
        if self.bad:
            item["bad_files"], self.bad = item.get("bad_files", []) + self.bad, []
        return item

    def _item(self, ref: Ref, key: str, members: dict[str, bytes]) -> dict[str, Any]:
        source = self.source
        generator = torch.Generator().manual_seed(seeded_int(source.seed, self.epoch, self.shards[ref[0]], key) >> 1)
        decoded, caption = source.decode(members, generator)
        return {"image": source.pixels(decoded, self.size_of, generator), "caption": caption}

    def _next_sample(self) -> Sample | None:
        """The next sample out of the shuffle buffer; None when this worker's shards are done."""
        capacity = self.source.shuffle_buffer
        while not self.draining:
            sample = self._read()
            if sample is None:
                self.draining = True
            elif capacity <= 1:
                return sample
            elif len(self.buffer) < capacity:
                self.buffer.append(sample)
            else:
                index = self._draw(len(self.buffer))
                sample, self.buffer[index] = self.buffer[index], sample
                return sample
        return self.buffer.pop(self._draw(len(self.buffer))) if self.buffer else None

    def _draw(self, n: int) -> int:
        self.draws += 1
        return seeded_index(n, self.source.seed, self.epoch, self.source.rank, self.worker, self.draws)

    def _read(self) -> Sample | None:
        """The next sample in tar order; None after the last shard."""
        while self.next[0] < len(self.shards):
            if self._reader is None:
                shard = self.shards[self.next[0]]
                self.fingerprints.setdefault(shard, shard_fingerprint(shard))
                self._reader = read_shard(shard, self.bad, start=self.next[1])
            sample = next(self._reader, None)
            if sample is None:
                self._reader, self.next = None, (self.next[0] + 1, 0)
                continue
            ref, self.next = self.next, (self.next[0], self.next[1] + 1)
            return ref, *sample
        return None

    def state_dict(self) -> dict[str, Any]:
        """The position, and what it is valid for: the worker's shard list (its hash, and the whole list's length)
        and the fingerprints of the shards the position reads again (the current one, those of buffered samples)."""
        held = None if self.held is None else [*self.held[0], self.held[1].get("bad_files", [])]
        places = {self.next[0], *(ref[0] for ref, _, _ in self.buffer), *([self.held[0][0]] if self.held else [])}
        reread = [self.shards[place] for place in sorted(places) if place < len(self.shards)]
        return {
            "assigned": self.shards_key,
            "listed": len(self.source.shards),
            "fingerprints": [self.fingerprints[shard] for shard in reread if shard in self.fingerprints],
            "epoch": self.epoch,
            "next": list(self.next),
            "draws": self.draws,
            "draining": self.draining,
            "buffer": [list(ref) for ref, _, _ in self.buffer],
            "held": held,
            "bad": list(self.bad),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state_dict`` was taken: the buffered samples' bytes are read again (and the held item
        decoded again); the reading goes on at the saved place when the next item is asked for. A state of only
        an epoch (``WebDatasetSource.resume_state`` of changed shards) starts that epoch."""
        self._start(state["epoch"])
        if "next" not in state:
            return
        self.fingerprints = {fingerprint[0]: fingerprint for fingerprint in state.get("fingerprints", [])}
        self.next, self.draws, self.draining = tuple(state["next"]), state["draws"], state["draining"]
        self.bad = list(state["bad"])
        buffered = [tuple(ref) for ref in state["buffer"]]
        held = None if state["held"] is None else tuple(state["held"][:2])
        found = self._reread([*buffered, *([held] if held else [])])
        self.buffer = [(ref, *found[ref]) for ref in buffered]
        if held is not None:
            item = self._item(held, *found[held])
            if state["held"][2]:
                item["bad_files"] = list(state["held"][2])
            self.held = (held, item)

    def _reread(self, refs: list[Ref]) -> dict[Ref, tuple[str, dict[str, bytes]]]:
        """The key and members of each sample in ``refs``, one pass over each shard they lie in."""
        wanted: dict[int, set[int]] = {}
        for shard, index in refs:
            wanted.setdefault(shard, set()).add(index)
        found = {}
        for shard, indices in wanted.items():
            first, last = min(indices), max(indices)
            for index, sample in enumerate(read_shard(self.shards[shard], [], start=first), start=first):
                if index in indices:
                    found[shard, index] = sample
                if index >= last:
                    break
        missing = [ref for ref in refs if ref not in found]
        if missing:
            raise ConfigError(
                "data.path",
                self.source.path,
                f"the saved stream position names sample {missing[0][1]} of {self.shards[missing[0][0]]}, which no "
                "longer has it (the shards changed since the checkpoint)",
                "resume with the shards the run was trained on, or start a fresh run in a new `hydra.run.dir`",
            )
        return found
