"""Each image's (width, height), which aspect-ratio buckets sort by, without reading a million headers at every start.

Sizes come from the data's own description when it gives every image's (``width``/``height`` in metadata.jsonl, or
integer columns of an hf data set, as img2dataset writes them). Otherwise the headers are read once, by the main
process, into a sizes index named by the data's fingerprint (its files with their sizes and modification times, or
the hf data set's own fingerprint); the other processes wait for it and read it, and so does every later launch that
keeps its indexes in the same folder: the folder of whoever reads the sizes (``image_sizes/`` in a run's folder, or in
the cache folder precompute writes), never one the reader does not own, such as the user's home; the indexes of an
earlier state of the data (another fingerprint) are deleted once the current ones are written. Without a folder
(a script reading data outside a run) the headers are read in memory and nothing is written. A stream (webdataset)
needs neither: it buckets each image as it decodes it.

A declared size only picks the bucket: the image is still resized to cover its bucket and cropped, so a wrong one
costs a worse crop (more of the image cut away), never a failed batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from dit_trainer.durable import write_text_atomically

logger = logging.getLogger(__name__)
Size = tuple[int, int]  # (width, height) in pixels, as decoded
# The names ``index_path`` gives, and the temporaries of their atomic writes: all an index folder holds.
INDEX_FILE = re.compile(r"[0-9a-f]{32}\.json|\.[0-9a-f]{32}\.json\.partial")


def declared_size(width: object, height: object) -> Size | None:
    """(width, height) when both are positive integers (what img2dataset writes), else None: the header will tell."""
    valid = all(isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in (width, height))
    return (width, height) if valid else None


def image_sizes(dataset: Dataset, index_dir: Path | None = None, show_progress: bool = False) -> list[Size | None]:
    """Every item's size (None: unreadable), declared, from the sizes index in ``index_dir``, or read from the
    headers (into that index; in memory alone without ``index_dir``). A mixture (``datasets``: its data sets' items
    one after the other) answers for each of its data sets. Every process of a run calls it (the main process alone
    reads the headers; the others wait for its index). ``index_dir`` then keeps the indexes of this data only."""
    used: set[Path] = set()
    sizes = _sizes(dataset, index_dir, show_progress, used)
    if index_dir is not None and _main_process():
        prune_indexes(index_dir, used)
    return sizes


def _sizes(dataset: Dataset, index_dir: Path | None, show_progress: bool, used: set[Path]) -> list[Size | None]:
    """``image_sizes`` of one data set (or of each part of a mixture), adding the indexes it reads to ``used``."""
    parts = getattr(dataset, "datasets", None)
    if parts is not None:
        return [size for part in parts for size in _sizes(part, index_dir, show_progress, used)]
    declared = getattr(dataset, "declared_sizes", lambda: None)()
    if declared is not None:
        return declared

    def read() -> list[Size | None]:
        items = tqdm(range(len(dataset)), desc="read image sizes", disable=not show_progress)
        return [dataset.image_size(index) for index in items]

    fingerprint = getattr(dataset, "sizes_fingerprint", lambda: None)()
    if fingerprint is None or index_dir is None:
        return read()
    used.add(index_path(index_dir, fingerprint))
    return indexed_sizes(fingerprint, read, len(dataset), index_dir)


def prune_indexes(index_dir: Path, keep: set[Path]) -> None:
    """Delete the indexes in ``index_dir`` other than ``keep`` (and temporaries an interrupted write left). The
    folder holds the indexes of one run's (or one cache's) data, so an index this launch did not read is of an
    earlier state of that data (a file touched, added or removed: another fingerprint) and would never be read
    again; without this every change of an image folder left one more index, with an entry per image. Runs after
    the new index is written (atomically): the data's sizes are always on disk. Only names an index can have are
    deleted; one that cannot be is left for the next launch."""
    try:
        stale = [path for path in index_dir.iterdir() if INDEX_FILE.fullmatch(path.name) and path not in keep]
    except OSError:  # no folder (nothing was indexed), or not readable: nothing to prune
        return
    for path in stale:
        try:
            path.unlink()
        except OSError as error:
            logger.debug(f"could not remove the stale sizes index {path} ({error})")


def _main_process() -> bool:
    """Not under torch.distributed, or its rank 0: the process that reads headers and writes the indexes."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return not distributed or torch.distributed.get_rank() == 0


def _load(path: Path, fingerprint: dict, count: int) -> list[Size | None] | None:
    """The sizes an index holds for ``fingerprint``; None when there is none, or it is unreadable or another's."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(stored, dict) or stored.get("fingerprint") != fingerprint:
        return None
    sizes = stored.get("sizes")
    if not isinstance(sizes, list) or len(sizes) != count:
        return None
    return [None if size is None else (int(size[0]), int(size[1])) for size in sizes]


def _store(path: Path, fingerprint: dict, sizes: list[Size | None]) -> None:
    """Write the index atomically; a folder that cannot be written costs the next launch a scan, not this run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps({"fingerprint": fingerprint, "sizes": sizes}, separators=(",", ":")))
    except OSError as error:
        logger.warning(f"the image sizes could not be kept in {path} ({error}): the next launch reads them again")


def index_path(index_dir: Path, fingerprint: dict) -> Path:
    """The index of the data ``fingerprint`` describes, in ``index_dir``: named by the fingerprint's digest, so that
    data sets (a mixture's parts, a changed folder) never share one."""
    return index_dir / f"{hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:32]}.json"


def indexed_sizes(
    fingerprint: dict, read: Callable[[], list[Size | None]], count: int, index_dir: Path
) -> list[Size | None]:
    """``read()``'s sizes, kept in ``index_dir``'s index of ``fingerprint``: read there when it exists (whole, and of
    this data), else computed by the main process and written, while the others wait (a barrier) and then read it."""
    path = index_path(index_dir, fingerprint)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    sizes = None
    if _main_process():
        sizes = _load(path, fingerprint, count)
        if sizes is None:
            logger.info(f"reading the sizes of {count} images once for aspect-ratio buckets; kept in {path}")
            sizes = read()
            _store(path, fingerprint, sizes)
    if distributed:
        torch.distributed.barrier()
    if sizes is None:  # another process: the main one has written the index (unless its folder was not writable)
        sizes = _load(path, fingerprint, count) or read()
    return sizes
