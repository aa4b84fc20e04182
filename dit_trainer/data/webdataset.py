"""WebDataset tar shards: each sample is the tar members sharing a key (``0001.jpg``, ``0001.txt``, ``0001.json``).

Shards are read in sequence with the standard library's ``tarfile`` (one pass, no index), so a broken member or a
truncated tar is skipped and reported exactly where it happens. ``webdataset`` supplies the key convention only.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import random
import tarfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from braceexpand import braceexpand
from PIL import Image
from torch.utils.data import IterableDataset
from webdataset.tariterators import base_plus_ext

from dit_trainer.config import DataConfig
from dit_trainer.data.source import Source, augmentation
from dit_trainer.data.streams import (
    process_rank_and_world_size,
    seeded_index,
    seeded_int,
    worker_and_workers,
)
from dit_trainer.data.transforms import (
    UNREADABLE_ERRORS,
    caption_keys,
    decode_image,
    describe_failure,
    json_type,
    pick_caption,
    to_model_input,
)
from dit_trainer.errors import ConfigError

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")


def expand_shards(pattern: str | None) -> list[str]:
    """The shard files of a brace pattern (``/x/{000000..000099}.tar``); all must exist."""
    shards = [str(Path(shard).expanduser()) for shard in braceexpand(pattern)] if pattern else []
    fix = "point `data.path` at tar shards in brace notation, e.g. `data.path='/data/shards/{000000..000099}.tar'`"
    if not shards:
        raise ConfigError("data.path", pattern, "it names no shards", fix)
    missing = [shard for shard in shards if not Path(shard).is_file()]
    if missing:
        raise ConfigError(
            "data.path", pattern, f"{len(missing)} of its {len(shards)} shards do not exist (e.g. {missing[0]})", fix
        )
    return shards


def shards_fingerprint(pattern: str) -> dict:
    """The shards' count, total size and a hash of their names and sizes: a shard written since (grown, added,
    replaced by one of another size) changes it, and no tar is read."""
    sized = [(Path(shard).name, Path(shard).stat().st_size) for shard in expand_shards(pattern)]
    names = hashlib.sha256(json.dumps(sized).encode()).hexdigest()
    return {"shards": len(sized), "bytes": sum(size for _, size in sized), "sha256": names}


def read_shard(shard: str, bad: list[str], start: int = 0) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {extension: bytes})`` per sample in tar order, from the ``start``-th sample on: the samples before it
    are passed over by their headers, their bytes never read into a sample (a resumed stream's skip). A tar that is
    cut off or corrupt ends here with one record appended to ``bad``; the samples before the damage are still
    yielded."""
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
    except (tarfile.TarError, OSError, EOFError) as error:
        bad.append(describe_failure(shard if key is None else f"{shard}:{key}", error))
        return
    if members:
        yield key, members


def caption_fields(members: dict[str, bytes]) -> dict[str, Any]:
    """What a caption can come from: ``txt`` (the .txt member) and every key of the .json member."""
    fields = json.loads(members["json"]) if "json" in members else {}
    if not isinstance(fields, dict):
        raise ValueError(f"the .json member is a JSON {json_type(fields)}, not an object")
    if "txt" in members:
        fields["txt"] = members["txt"].decode("utf-8").removeprefix("\ufeff")  # some editors start with a BOM
    return fields


class WebDatasetSource(IterableDataset):
    """Samples from tar shards, split across ranks and then DataLoader workers by whole shards.

    Every epoch all ranks shuffle the shard list the same way (``seed + epoch``, see ``set_epoch``) and take every
    ``world_size x num_workers``-th shard, so each sample is read once per epoch when there are at least that many
    shards. Unreadable samples are skipped and reported in the next item's ``"bad_files"`` (the last item's, for
    those after it).
    """

    def __init__(
        self,
        path: str,
        resolution: int,
        caption_column: str = "txt",
        crop: str = "center",
        horizontal_flip: bool = False,
        caption_columns: Sequence[str] = (),
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle_buffer: int = 0,
    ) -> None:
        self.path, self.resolution, self.crop, self.horizontal_flip = path, resolution, crop, horizontal_flip
        self.seed, self.epoch, self.shuffle_buffer = seed, 0, shuffle_buffer
        default_rank, default_world_size = process_rank_and_world_size()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world_size if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.shards = expand_shards(path)
        self.caption_key, self.caption_columns = caption_keys(caption_column, caption_columns)
        self._check_caption_columns()

    def _check_caption_columns(self) -> None:
        """Fail before training when the first sample lacks a caption column: that is a config error, not data."""
        first = next(read_shard(self.shards[0], []), None)
        if first is None:
            return  # an unreadable first shard is skipped like any other
        try:
            fields = caption_fields(first[1])
        except UNREADABLE_ERRORS:
            return  # so is a broken first sample
        missing = [column for column in self.caption_columns if column not in fields]
        if missing:
            raise ConfigError(
                self.caption_key,
                missing[0] if self.caption_key == "data.caption_column" else self.caption_columns,
                f"the first sample of {self.shards[0]} has no caption {missing[0]!r}; it offers {sorted(fields)} "
                "(`txt` is the .txt member, the others are keys of the .json member)",
                f"set `{self.caption_key}` to one of those",
            )

    def unsharded(self) -> WebDatasetSource:
        """This data set read whole by whichever process iterates it (validation on the main process reads every
        validation shard, whatever the number of processes)."""
        whole = copy.copy(self)
        whole.rank, whole.world_size = 0, 1
        return whole

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle the shards for ``epoch``. Workers copy the data set when an iterator starts, so call it before
        ``iter(loader)`` and use ``persistent_workers=False``."""
        self.epoch = epoch

    def assigned_shards(self, epoch: int | None = None) -> list[str]:
        """This rank's and this worker's shards for ``epoch`` (default: the current one)."""
        order = list(self.shards)
        random.Random(self.seed + (self.epoch if epoch is None else epoch)).shuffle(order)
        worker, workers = worker_and_workers()
        slots = self.world_size * workers
        if len(order) < slots and worker == 0:
            logger.warning(
                "data.path has %d shards for %d ranks x %d workers: some workers get no data and ranks see "
                "unequal amounts. Write more, smaller shards or lower data.num_workers.",
                len(order),
                self.world_size,
                workers,
            )
        return order[self.rank * workers + worker :: slots]

    def decode(self, members: dict[str, bytes], generator: torch.Generator | None = None) -> tuple[Image.Image, str]:
        """The image and a caption (drawn from ``generator`` when there are several) of one sample; raises one of
        ``UNREADABLE_ERRORS`` if it has none."""
        extension = next((e for e in IMAGE_EXTENSIONS if e in members), None)
        if extension is None:
            raise ValueError(f"no image member (it has {', '.join(sorted(members))})")
        fields = caption_fields(members)
        missing = [column for column in self.caption_columns if column not in fields]
        if missing:
            raise ValueError(f"no caption {missing[0]!r}")
        captions = [fields[c] for c in self.caption_columns]
        return decode_image(members[extension]), pick_caption(captions, generator)

    def __iter__(self) -> ShardStream:
        return self.items(lambda image: (self.resolution, self.resolution))

    def items(self, size_of: Callable[[Image.Image], tuple[int, int]]) -> ShardStream:
        """The stream's items, each image brought to the (height, width) ``size_of`` picks for it."""
        return ShardStream(self, size_of)


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

    Each item is held back until the next readable one is decoded, so records of unreadable samples after the last
    good one still reach the trainer (on that last item) instead of being lost when the stream ends.
    """

    def __init__(self, source: WebDatasetSource, size_of: Callable[[Image.Image], tuple[int, int]]) -> None:
        self.source, self.size_of = source, size_of
        self.worker = worker_and_workers()[0]
        self._start(source.epoch)

    def _start(self, epoch: int) -> None:
        self.epoch = epoch
        self.shards = self.source.assigned_shards(epoch)
        self.next: Ref = (0, 0)  # the next sample to read
        self.draws = 0
        self.draining = False  # every shard read: the buffer empties
        self.buffer: list[Sample] = []
        self.held: tuple[Ref, dict[str, Any]] | None = None
        self.bad: list[str] = []  # records not yet attached to an item
        self._reader: Iterator[tuple[str, dict[str, bytes]]] | None = None

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
        image, caption = source.decode(members, generator)
        pixels = to_model_input(image, self.size_of(image), source.crop, source.horizontal_flip, generator)
        return {"image": pixels, "caption": caption}

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
                self._reader = read_shard(self.shards[self.next[0]], self.bad, start=self.next[1])
            sample = next(self._reader, None)
            if sample is None:
                self._reader, self.next = None, (self.next[0] + 1, 0)
                continue
            ref, self.next = self.next, (self.next[0], self.next[1] + 1)
            return ref, *sample
        return None

    def state_dict(self) -> dict[str, Any]:
        held = None if self.held is None else [*self.held[0], self.held[1].get("bad_files", [])]
        return {
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
        decoded again); the reading goes on at the saved place when the next item is asked for."""
        self._start(state["epoch"])
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


def _build(cfg: DataConfig) -> WebDatasetSource:
    return WebDatasetSource(
        cfg.path,
        cfg.resolution,
        cfg.caption_column,
        seed=cfg.seed,
        shuffle_buffer=cfg.shuffle_buffer,
        **augmentation(cfg),
    )


SOURCE = Source(
    _build,
    "tar shards in brace notation",
    "'/data/shards/{000000..000099}.tar'",
    streamed=True,
    bucketed=True,
    content=lambda cfg: shards_fingerprint(cfg.path),
)
