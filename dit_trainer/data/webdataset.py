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
from torch.utils.data import IterableDataset, get_worker_info
from webdataset.tariterators import base_plus_ext

from dit_trainer.config import DataConfig
from dit_trainer.data.source import Source, augmentation
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


def read_shard(shard: str, bad: list[str]) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {extension: bytes})`` per sample in tar order. A tar that is cut off or corrupt ends here with one
    record appended to ``bad``; the samples before the damage are still yielded."""
    key, members = None, {}
    try:
        with tarfile.open(shard, mode="r|*") as tar:
            for info in tar:
                prefix, extension = base_plus_ext(info.name) if info.isfile() else (None, None)
                if prefix is None:
                    continue
                if prefix != key and members:
                    yield key, members
                    members = {}
                key = prefix
                members[extension.lower()] = tar.extractfile(info).read()
                tar.members = []  # a stream-mode TarFile otherwise keeps every header it has read
    except (tarfile.TarError, OSError, EOFError) as error:
        bad.append(describe_failure(shard if key is None else f"{shard}:{key}", error))
        return
    if members:
        yield key, members


def process_rank_and_world_size() -> tuple[int, int]:
    """This process's place in torch.distributed (initialised by accelerate), or (0, 1) when it runs alone."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


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

    def assigned_shards(self) -> list[str]:
        """This rank's and this worker's shards for the current epoch."""
        order = list(self.shards)
        random.Random(self.seed + self.epoch).shuffle(order)
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
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

    def decode(self, members: dict[str, bytes]) -> tuple[Image.Image, str]:
        """The image and a caption of one sample; raises one of ``UNREADABLE_ERRORS`` if it has none."""
        extension = next((e for e in IMAGE_EXTENSIONS if e in members), None)
        if extension is None:
            raise ValueError(f"no image member (it has {', '.join(sorted(members))})")
        fields = caption_fields(members)
        missing = [column for column in self.caption_columns if column not in fields]
        if missing:
            raise ValueError(f"no caption {missing[0]!r}")
        return decode_image(members[extension]), pick_caption([fields[c] for c in self.caption_columns])

    def samples(self, bad: list[str]) -> Iterator[tuple[str, str, dict[str, bytes]]]:
        """``(shard, key, members)`` of this worker's shards, still encoded, through a shuffle buffer of
        ``shuffle_buffer`` samples: tar order puts similar images together (one crawl, one source), and a batch of
        neighbours is a biased one. The buffer's order is seeded per epoch, rank and worker, so a resumed run
        reads the same sequence again."""
        stream = ((shard, key, members) for shard in self.assigned_shards() for key, members in read_shard(shard, bad))
        if self.shuffle_buffer <= 1:
            yield from stream
            return
        info = get_worker_info()
        rng = random.Random(hash((self.seed, self.epoch, self.rank, info.id if info else 0)))
        buffer: list[tuple[str, str, dict[str, bytes]]] = []
        for sample in stream:
            if len(buffer) < self.shuffle_buffer:
                buffer.append(sample)
                continue
            index = rng.randrange(len(buffer))
            yield buffer[index]
            buffer[index] = sample
        rng.shuffle(buffer)
        yield from buffer

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.items(lambda image: (self.resolution, self.resolution))

    def items(self, size_of: Callable[[Image.Image], tuple[int, int]]) -> Iterator[dict[str, Any]]:
        """The stream's items, each image brought to the (height, width) ``size_of`` picks for it."""
        # Each item is held back until the next one is ready, so records of bad samples after the last good one
        # still reach the trainer (on that last item) instead of being lost when the stream ends.
        bad: list[str] = []
        previous: dict[str, Any] | None = None
        for shard, key, members in self.samples(bad):
            try:  # the transform too: an image can decode and still fail to convert
                image, caption = self.decode(members)
                pixels = to_model_input(image, size_of(image), self.crop, self.horizontal_flip)
            except UNREADABLE_ERRORS as error:
                bad.append(describe_failure(f"{shard}:{key}", error))
                continue
            if previous is not None:
                yield previous
            previous = {"image": pixels, "caption": caption}
            if bad:
                previous["bad_files"] = list(bad)
                bad.clear()
        if previous is not None:
            if bad:
                previous["bad_files"] = previous.get("bad_files", []) + bad
            yield previous
        elif bad:
            logger.warning("this worker read no image, only %d unreadable samples: %s", len(bad), "; ".join(bad))


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
