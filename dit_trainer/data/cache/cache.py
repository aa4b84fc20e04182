"""The on-disk cache of what the frozen encoders make of a data set: written once by ``scripts/precompute.py``,
read by training instead of running the VAE encoder and the text encoder every step.

Layout of ``data.cache_dir``::

    index.json                      fingerprint, shapes, dtype, shards, the prompts of prompts.safetensors
    shard-RRRRR-KKKKK.safetensors   latent_mean, latent_std (the VAE posterior; no std for a deterministic
                                    autoencoder or pixels), text_embeds, text_mask and, for
                                    conditioners with a pooled vector, text_pooled; captions
    prompts.safetensors             conditions of "" (caption dropout) and the sample / monitor prompts
    image_sizes/                    with buckets: the sizes index of the source's images (``image_sizes.py``),
                                    read before encoding and kept, so a precompute run again reads no header

The posterior's mean and std are kept, not one latent, so training still draws a fresh latent every epoch. The
fingerprint records everything that shaped the tensors, the data's content included (as far as it can be told
without reading every image); a cache made with other settings or from other data is refused, never trained on.
Each rank of a multi-process precompute writes its own shards (``RRRRR`` = rank) and a list of them
(``shards-RRRRR.json``); rank 0 writes the index last, so a cache without ``index.json`` is incomplete and is
refused. The folder holds nothing else: precompute writes only into a folder of its own, and deletes only files
with the names above (never the sizes index).
"""

from __future__ import annotations

import bisect
import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset

from dit_trainer.condition import Condition
from dit_trainer.data.buckets import BucketTable
from dit_trainer.data.cache.cached_prompts import CachedPrompts
from dit_trainer.data.cache.fingerprint import check_fingerprint
from dit_trainer.data.image_sizes import INDEX_FILE
from dit_trainer.durable import share_as_umask_allows
from dit_trainer.errors import ConfigError, shortlist

INDEX = "index.json"
PROMPTS = "prompts.safetensors"
SHARD_LIST = "shards-{rank:05d}.json"  # one rank's shards, read by rank 0 to write the index
IMAGE_SIZES = "image_sizes"  # the folder of the source's sizes index, which precompute's buckets read
# Every name precompute writes: those of ``shard_name``, ``SHARD_LIST``, the index, the prompts and the temporaries
# of their atomic writes. These are the only files it ever deletes (what an unfinished precompute left).
CACHE_FILE = re.compile(
    r"shard-\d{5}-\d{5}\.safetensors|shards-\d{5}\.json|index\.json|prompts\.safetensors|"
    r"\.(index\.json|prompts\.safetensors)\.partial"
)
INDEX_KEYS = ("fingerprint", "items", "dtype", "shards", "prompts")
TENSOR_KEYS = ("latent_mean", "latent_std", "text_embeds", "text_mask", "text_pooled")  # text_pooled: when given
IN_MEMORY_BYTES = 2 << 30  # as stored, and as held in memory


def read_index(cache_dir: Path) -> dict:
    """The index of a complete cache; a missing or partial cache, or an ``index.json`` that some other program
    wrote, is a ``ConfigError`` naming ``data.cache_dir``."""
    path = cache_dir / INDEX
    if cache_dir.exists() and not cache_dir.is_dir():
        raise ConfigError(
            "data.cache_dir",
            str(cache_dir),
            "it is a file, not a cache folder",
            "point `data.cache_dir` at the folder `python scripts/precompute.py` wrote (or will write)",
        )
    if not path.is_file():
        raise ConfigError(
            "data.cache_dir",
            str(cache_dir),
            f"there is no complete cache there (no {INDEX}: never written, or its precompute did not finish)",
            "write it with `python scripts/precompute.py <the same overrides as train.py>`",
        )
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        index = None
    if not isinstance(index, dict) or any(key not in index for key in INDEX_KEYS):
        raise ConfigError(
            "data.cache_dir",
            str(cache_dir),
            f"its {INDEX} was not written by scripts/precompute.py (it is not a cache index)",
            "point `data.cache_dir` at a cache written by `python scripts/precompute.py`, or at a new or empty "
            "folder to write one there",
        )
    return index


def _foreign(entry: Path) -> list[str]:
    """What of ``entry`` (in the cache folder) precompute did not write: nothing for a file with a cache's own name,
    nor for the index files of the sizes index folder (a real folder: through a link, the index is written
    elsewhere)."""
    if entry.name == IMAGE_SIZES and entry.is_dir() and not entry.is_symlink():
        others = [file for file in sorted(entry.iterdir()) if not (file.is_file() and INDEX_FILE.fullmatch(file.name))]
        return [f"{IMAGE_SIZES}/{file.name}" for file in others]
    return [] if entry.is_file() and CACHE_FILE.fullmatch(entry.name) else [entry.name]


def check_cache_folder(cache_dir: Path) -> list[Path]:
    """What an unfinished precompute left in ``cache_dir`` (files with the cache's own names, to be replaced; the
    sizes index folder is kept, for the next attempt to read). A file, or a folder holding anything else, is
    refused: it is the user's, and precompute never deletes it."""
    if cache_dir.exists() and not cache_dir.is_dir():
        raise ConfigError(
            "data.cache_dir", str(cache_dir), "it is a file, not a folder", "point it at a new or empty folder"
        )
    entries = sorted(cache_dir.iterdir()) if cache_dir.is_dir() else []
    foreign = [name for entry in entries for name in _foreign(entry)]
    if foreign:
        shown = shortlist(foreign, 3)
        raise ConfigError(
            "data.cache_dir",
            str(cache_dir),
            f"it holds files that are not part of a cache ({shown}), and precompute writes a cache only into a "
            "folder of its own so that it never deletes anything else",
            "point `data.cache_dir` at a new or empty folder",
        )
    return [entry for entry in entries if entry.name != IMAGE_SIZES]


class CacheDataset(Dataset):
    """Items ``{"latent_mean", "latent_std", "text_embeds", "text_mask", "caption"}`` (``text_pooled`` too when the
    conditioner gave one, no ``latent_std`` when the autoencoder is deterministic): floats in their storage dtype
    (``data.cache_dtype``: float16 takes half the memory and half the bytes to the GPU; the step widens them there,
    exactly), masks as int64.

    A cache up to ``IN_MEMORY_BYTES`` is read into memory once (indexing it costs microseconds, so the cache never
    slows a step); a larger one is read row by row from the memory-mapped shards, so it needs no RAM of its own.
    A cache of bucketed data has one image size per shard (its ``size`` in the index): ``buckets`` and ``table``
    say which bucket each item is in, and in memory the shards of each bucket form one block of tensors.
    """

    def __init__(self, cache_dir: Path, index: dict) -> None:
        self.shards = [cache_dir / shard["file"] for shard in index["shards"]]
        self.offsets = [0]
        for shard in index["shards"]:
            self.offsets.append(self.offsets[-1] + shard["items"])
        self._handles: dict[int, object] = {}  # opened lazily, so each DataLoader worker opens its own
        metadata = [self._handle(k).metadata() for k in range(len(self.shards))]
        self.keys = [key for key in TENSOR_KEYS if not self.shards or key in self._handle(0).keys()]  # noqa: SIM118 (a safetensors handle)
        self.captions = [caption for shard in metadata for caption in json.loads(shard["captions"])]
        sizes = [tuple(shard.get("size", ())) for shard in index["shards"]]  # (height, width) when bucketed
        self.cache_dir = cache_dir
        self.source_indices = self._source_indices(metadata, index, any(sizes))
        self.table = BucketTable(tuple(dict.fromkeys(sizes))) if any(sizes) else None
        shard_blocks = [self.table.sizes.index(size) for size in sizes] if self.table else [0] * len(sizes)
        item_blocks = [block for block, shard in zip(shard_blocks, index["shards"]) for _ in range(shard["items"])]
        self.buckets = item_blocks if self.table else None
        self.in_memory = bool(self.shards) and sum(path.stat().st_size for path in self.shards) <= IN_MEMORY_BYTES
        if self.in_memory:  # masks already int64: an item is then a view, no conversion per step
            loaded = [opened(path, load_file) for path in self.shards]
            self.blocks = {
                block: {
                    key: torch.cat([self._widen(shard[key]) for shard, b in zip(loaded, shard_blocks) if b == block])
                    for key in self.keys
                }
                for block in sorted(set(shard_blocks))
            }
            self.item_blocks, rows, counts = item_blocks, [], Counter()
            for block in item_blocks:  # an item's row within its block
                rows.append(counts[block])
                counts[block] += 1
            self.item_rows = torch.tensor(rows, dtype=torch.long)
        self._handles.clear()

    def __len__(self) -> int:
        return self.offsets[-1]

    def _source_indices(self, metadata: list[dict], index: dict, bucketed: bool) -> list[int] | None:
        """Which source item each row holds. A cache written before shards recorded it is in source order when one
        process wrote it without buckets; otherwise (None) its rows cannot be told apart."""
        if all("indices" in shard for shard in metadata):
            return [item for shard in metadata for item in json.loads(shard["indices"])]
        in_order = not bucketed and all(shard["file"].startswith(shard_name(0, 0)[:12]) for shard in index["shards"])
        return list(range(len(self.captions))) if in_order else None

    def rows_of(self, items: Sequence[int]) -> list[int]:
        """The rows (ascending) that hold the source items ``items``: one side of the held-out split, say."""
        if self.source_indices is None:
            raise ConfigError(
                "data.cache_dir",
                str(self.cache_dir),
                "it was written (with buckets or by several processes, so its rows are not in source order) before "
                "caches recorded which source item each row holds, so the held-out items' rows cannot be found",
                "write the cache again with `python scripts/precompute.py <the same overrides as train.py>` into a new "
                "folder, or train from it without `validation.split`",
            )
        wanted = set(items)
        return [row for row, item in enumerate(self.source_indices) if item in wanted]

    def _handle(self, shard: int):
        if shard not in self._handles:
            self._handles[shard] = opened(self.shards[shard], lambda path: safe_open(path, framework="pt"))
        return self._handles[shard]

    @staticmethod
    def _widen(tensor: torch.Tensor) -> torch.Tensor:
        """Integers (masks, class ids: stored in the smallest type that holds them) as int64; floats stay as
        stored until they are on the device."""
        return tensor if tensor.is_floating_point() else tensor.long()

    def _row(self, key: str, index: int) -> torch.Tensor:
        if self.in_memory:
            return self.blocks[self.item_blocks[index]][key][self.item_rows[index]]
        shard = bisect.bisect_right(self.offsets, index) - 1
        row = index - self.offsets[shard]
        return self._widen(self._handle(shard).get_slice(key)[row : row + 1][0])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | str]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        item = {key: self._row(key, index) for key in self.keys}
        return item | {"caption": self.captions[index]}

    def __getitems__(self, indices: list[int]) -> dict[str, Any] | list[dict[str, Any]]:
        """A whole batch at once (the DataLoader calls this when it exists). In memory: one gather per tensor,
        handed to ``collate_batch`` as the batch itself, so no per-item views are made and stacked again."""
        if not self.in_memory or not indices:  # an empty list: a Poisson draw (DP) that selected nothing
            return [self[index] for index in indices]
        blocks = {self.item_blocks[index] for index in indices}
        if len(blocks) > 1:  # items of several buckets (reading in source order): stacked by whoever asked
            return [self[index] for index in indices]
        block = self.blocks[blocks.pop()]
        rows = self.item_rows[torch.as_tensor(indices, dtype=torch.long)]
        batch = {key: block[key].index_select(0, rows) for key in self.keys}  # faster than [rows]
        return batch | {"caption": [self.captions[index] for index in indices], "bad_files": []}


T = TypeVar("T")


def opened(path: Path, read: Callable[[str], T]) -> T:
    """``read(path)`` of a file the index names: a missing or unreadable one is a ``ConfigError`` naming it."""
    try:
        return read(str(path))
    except (OSError, SafetensorError) as error:
        raise ConfigError(
            "data.cache_dir",
            str(path.parent),
            f"the cache is damaged: {path.name} is missing or unreadable ({str(error)[:200]})",
            "write the cache again with `python scripts/precompute.py <the same overrides as train.py>` into a new "
            "folder",
        ) from error


def open_cache(
    cache_dir: str, fingerprint: dict, prompts: Sequence[str], device: torch.device
) -> tuple[CacheDataset, CachedPrompts]:
    """The cache at ``cache_dir`` (``data.cache_dir``), checked against this run's ``fingerprint``
    (``cache_fingerprint``: its settings, buckets and data) and holding every prompt the run samples (``prompts``:
    ``prompts.sampled_prompts``)."""
    folder = Path(str(cache_dir)).expanduser()
    index = read_index(folder)
    check_fingerprint(index, fingerprint, folder)
    stored = opened(folder / PROMPTS, load_file)
    text = CachedPrompts(index["prompts"], Condition.from_stored(stored), device, str(cache_dir))
    text.encode(list(prompts))  # a missing sample/monitor prompt fails now, not at the first sample grid
    return CacheDataset(folder, index), text


def shard_name(rank: int, number: int) -> str:
    return f"shard-{rank:05d}-{number:05d}.safetensors"


def refuse_non_finite(
    tensors: dict[str, torch.Tensor], captions: list[str], key: str, value: Any, where: str, cause: str, fix: str
) -> None:
    """Encoded tensors (one row per caption) with NaN/inf are refused where they are made, rather than poisoning
    every epoch of training; ``key`` and ``value`` name the setting to change, ``where`` the rows' place."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            bad = (~torch.isfinite(tensor.flatten(1))).any(1).nonzero().flatten().tolist()
            shown = [captions[i] for i in bad[:3]]
            problem = f"{name} is NaN/inf for {len(bad)} items{where} (captions {shown}): {cause}"
            raise ConfigError(key, value, problem, fix)


def integer_storage(tensor: torch.Tensor) -> torch.dtype:
    """The smallest signed integer type that holds every value of ``tensor``: masks (0/1) take a byte, class ids
    of a class-conditional cache (300 of them, say) what they need. The reader widens every integer to int64, so
    shards of one cache may differ in it, and caches written with int8 masks read as before."""
    if tensor.numel() == 0 or tensor.dtype == torch.bool:
        return torch.int8
    low, high = int(tensor.min()), int(tensor.max())
    integers = (torch.int8, torch.int16, torch.int32, torch.int64)
    return next(kind for kind in integers if torch.iinfo(kind).min <= low and high <= torch.iinfo(kind).max)


def save_shard(
    path: Path, tensors: dict[str, torch.Tensor], captions: list[str], indices: list[int] | None, dtype: torch.dtype
) -> None:
    """One shard, float tensors in the storage ``dtype`` (integers in one that holds them: ``integer_storage``), with
    each row's caption and source item (``indices``: the rows of a bucketed or multi-process cache are not in source
    order); NaN/inf is refused at write time (an encoder that overflowed, or values beyond float16's range)."""
    stored = {k: v.to(dtype if v.is_floating_point() else integer_storage(v)).contiguous() for k, v in tensors.items()}
    refuse_non_finite(
        stored,
        captions,
        "data.cache_dtype",
        str(dtype).removeprefix("torch."),
        f" of {path.name}",
        "the encoder overflowed or the values exceed the storage dtype",
        "precompute in float32 (`trainer.mixed_precision=no`), store as `data.cache_dtype=bfloat16` or float32, or "
        "check those images",
    )
    metadata = {"captions": json.dumps(captions)} | ({"indices": json.dumps(indices)} if indices is not None else {})
    save_file(stored, path, metadata=metadata)
    share_as_umask_allows(path)  # safetensors writes 0600: a shared cache is read by the team
