"""WebDataset tar shards: each sample is the tar members sharing a key (``0001.jpg``, ``0001.txt``, ``0001.json``),
split over processes and DataLoader workers by whole shards and read by ``shard_stream.ShardStream``. With
``data.frames`` > 1 a sample's video member (``0001.mp4``, ``.webm``, ...) gives a clip, decoded as the video
folder's are (``videofolder.decode_clip``)."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import random
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from braceexpand import braceexpand
from PIL import Image
from torch.utils.data import IterableDataset

from dit_trainer.config import DataConfig
from dit_trainer.data.sources.shard_stream import ShardStream, read_shard
from dit_trainer.data.sources.source import Source, augmentation
from dit_trainer.data.sources.streams import process_rank_and_world_size, worker_and_workers
from dit_trainer.data.sources.transforms import (
    UNREADABLE_ERRORS,
    VIDEO_SUFFIXES,
    caption_keys,
    decode_image,
    json_type,
    pick_caption,
    to_model_input,
)
from dit_trainer.data.sources.videofolder import decode_clip, prepare_clip
from dit_trainer.data.stream_changes import list_key, refuse_unless_allowed, shard_changes
from dit_trainer.errors import ConfigError, require

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "tif", "tiff")
VIDEO_EXTENSIONS = tuple(suffix.removeprefix(".") for suffix in VIDEO_SUFFIXES)
SAMPLES_CHECKED = 8  # the first shard's samples whose caption fields tell a wrong caption column from a bad sample
Decoded = Image.Image | list[np.ndarray]  # an image, or a clip's frames (H, W, 3)


def expand_shards(pattern: str | None) -> list[str]:
    """The shard files of a brace pattern (``/x/{000000..000099}.tar``); all must exist."""
    shards = [str(Path(shard).expanduser()) for shard in braceexpand(pattern)] if pattern else []
    fix = (
        "point `data.path` at tar shards in brace notation, typed in a shell with quotes around the whole override "
        "and around the pattern, e.g. `\"data.path='/data/shards/{000000..000099}.tar'\"`"
    )
    if not shards:
        raise ConfigError("data.path", pattern, "it names no shards", fix)
    folders = [shard for shard in shards if Path(shard).is_dir()]
    if folders:
        raise ConfigError(
            "data.path", pattern, f"{folders[0]} is a folder, and webdataset reads tar shards (files)", fix
        )
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
        caption_prefix: str = "",
        frames: int = 1,
        fps: float | None = None,
    ) -> None:
        self.path, self.resolution, self.crop, self.horizontal_flip = path, resolution, crop, horizontal_flip
        self.frames, self.fps = frames, fps
        self.seed, self.epoch, self.shuffle_buffer = seed, 0, shuffle_buffer
        self.caption_prefix = caption_prefix
        default_rank, default_world_size = process_rank_and_world_size()
        self.rank = default_rank if rank is None else rank
        self.world_size = default_world_size if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        self.shards = expand_shards(path)
        self.caption_key, self.caption_columns = caption_keys(caption_column, caption_columns)
        self._check_caption_columns()

    def _check_caption_columns(self) -> None:
        """Fail before training when none of the first samples has a caption column: that is a config error. A
        sample among them without it is one of the data's, skipped and counted like any unreadable one."""
        offered, read = set(), 0
        for _, members in islice(read_shard(self.shards[0], []), SAMPLES_CHECKED):
            try:
                offered |= set(caption_fields(members))
            except UNREADABLE_ERRORS:
                continue  # a broken sample is skipped like any other
            read += 1
        missing = [column for column in self.caption_columns if column not in offered]
        if read and missing:  # (an unreadable first shard is skipped like any other)
            shard = self.shards[0]
            samples = f"the first sample of {shard} has" if read == 1 else f"the first {read} samples of {shard} have"
            raise ConfigError(
                self.caption_key,
                missing[0] if self.caption_key == "data.caption_column" else self.caption_columns,
                f"{samples} no caption {missing[0]!r}, only {sorted(offered)} (`txt` is the "
                ".txt member, the others are keys of the .json member)",
                f"set `{self.caption_key}` to one of those",
            )

    def check_shares(self) -> None:
        """Refuse, before any worker starts, fewer shards than processes: each process streams its own shards, and
        one without any could never give a batch (it failed in the first step, on that process only)."""
        require(
            len(self.shards) >= self.world_size,
            "data.path",
            self.path,
            f"it has {len(self.shards)} shards for {self.world_size} processes, and each process streams shards of "
            f"its own: {self.world_size - len(self.shards)} would have none to train on",
            "write at least as many shards as processes (as many as processes x `data.num_workers` lets every "
            "data-loader worker read), or launch fewer processes",
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
        worker, workers = worker_and_workers()
        slots = self.world_size * workers
        if len(self.shards) < slots and worker == 0:
            logger.warning(
                "data.path has %d shards for %d ranks x %d workers: some workers get no data and ranks see "
                "unequal amounts. Write more, smaller shards or lower data.num_workers.",
                len(self.shards),
                self.world_size,
                workers,
            )
        return self.worker_shards(self.epoch if epoch is None else epoch, worker, workers)

    def worker_shards(self, epoch: int, worker: int, workers: int) -> list[str]:
        """The shards of this rank's ``worker`` (of ``workers``) for ``epoch``: every rank shuffles the whole list
        the same way and takes every ``world_size x workers``-th shard."""
        order = list(self.shards)
        random.Random(self.seed + epoch).shuffle(order)
        return order[self.rank * workers + worker :: self.world_size * workers]

    def resume_state(
        self, state: dict[str, Any], worker: int, workers: int, allow_change: bool
    ) -> tuple[dict[str, Any], list[str]]:
        """``state`` (``worker``'s ``ShardStream.state_dict``) and nothing, if its shard list and the shards its
        position reads again are as they were; else what changed, refused unless ``allow_change``, and the state of
        a stream that starts the saved epoch again on the current shards (a state saved before streams recorded
        their shards is taken as it is)."""
        if "assigned" not in state:
            return state, []
        epoch = state["epoch"]
        if state["assigned"] != list_key(self.worker_shards(epoch, worker, workers)):
            changes = [
                f"another shard list or order ({state['listed']} shards at the checkpoint, {len(self.shards)} now)"
            ]
        else:
            changes = shard_changes(state["fingerprints"])
        refuse_unless_allowed("data.path", self.path, changes, allow_change)
        return ({"epoch": epoch} if changes else state), changes

    def decode(self, members: dict[str, bytes], generator: torch.Generator | None = None) -> tuple[Decoded, str]:
        """The image (or, with ``frames`` > 1, the clip's frames, from an offset drawn from ``generator``) and a
        caption (drawn from ``generator`` when there are several) of one sample; raises one of
        ``UNREADABLE_ERRORS`` if it has none."""
        wanted = VIDEO_EXTENSIONS if self.frames > 1 else IMAGE_EXTENSIONS
        extension = next((e for e in wanted if e in members), None)
        if extension is None:
            kind = "video" if self.frames > 1 else "image"
            raise ValueError(f"no {kind} member (it has {', '.join(sorted(members))})")
        fields = caption_fields(members)
        missing = [column for column in self.caption_columns if column not in fields]
        if missing:
            raise ValueError(f"no caption {missing[0]!r}")
        captions = [fields[c] for c in self.caption_columns]
        if self.frames > 1:
            decoded: Decoded = decode_clip(io.BytesIO(members[extension]), self.frames, self.fps, generator)
        else:
            decoded = decode_image(members[extension])
        return decoded, pick_caption(captions, generator, self.caption_prefix)

    def pixels(
        self, decoded: Decoded, size_of: Callable[[Image.Image], tuple[int, int]], generator: torch.Generator
    ) -> torch.Tensor:
        """The model input of a decoded sample, brought to the size ``size_of`` picks for it (for a clip, for its
        first frame: every frame is cut alike)."""
        if isinstance(decoded, Image.Image):
            return to_model_input(decoded, size_of(decoded), self.crop, self.horizontal_flip, generator)
        size = size_of(Image.fromarray(decoded[0]))
        return prepare_clip(decoded, size, self.crop, self.horizontal_flip, generator)

    def __iter__(self) -> ShardStream:
        return self.items(lambda image: (self.resolution, self.resolution))

    def items(self, size_of: Callable[[Image.Image], tuple[int, int]]) -> ShardStream:
        """The stream's items, each image brought to the (height, width) ``size_of`` picks for it."""
        return ShardStream(self, size_of)


def _build(cfg: DataConfig) -> WebDatasetSource:
    return WebDatasetSource(
        cfg.path,
        cfg.resolution,
        cfg.caption_column,
        seed=cfg.seed,
        shuffle_buffer=cfg.shuffle_buffer,
        frames=cfg.frames,
        fps=cfg.fps,
        **augmentation(cfg),
    )


SOURCE = Source(
    _build,
    "tar shards in brace notation",
    "'/data/shards/{000000..000099}.tar'",  # quoted for Hydra; data/checks.py puts the override in shell quotes
    streamed=True,
    bucketed=True,
    caption_prefix=True,
    content=lambda cfg: shards_fingerprint(cfg.path),
    clips=True,  # with `data.frames` > 1: each sample's video member
)
