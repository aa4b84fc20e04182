"""Batches, and how skipped files travel from the data sources to the trainer.

A corrupt JPEG among millions must not end a week-long run, nor vanish unnoticed. So a source skips it, gives a
readable file in its place and records it in that item's ``"bad_files"`` (``"name: reason"`` strings);
``collate_batch`` gathers those per batch, and the trainer counts them against ``data.max_bad_fraction``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset

from dit_trainer.condition import Batch
from dit_trainer.data.sources.transforms import UNREADABLE_ERRORS, UnfitFile, describe_failure, to_model_input
from dit_trainer.errors import ConfigError

# A map-style item gives up after this many unreadable files in a row: by then the data set itself (the folder, the
# column) is wrong, and one clear error beats an endless search.
MAX_CONSECUTIVE_BAD = 100


def collate_batch(items: list[dict[str, Any]] | Batch) -> Batch:
    """Tensors stacked, everything else (captions) as lists, and ``"bad_files"`` always present (maybe empty).

    Unlike the DataLoader's default collate, it accepts items with and without ``"bad_files"`` in one batch, and
    keeps ``"source_index"`` only where every item has one (a stream mixed with a map-style source numbers only the
    latter's). A data set that gathers whole batches itself (``__getitems__`` returning a dict, as the in-memory
    cache does) has collated already: its batch passes through.
    """
    if isinstance(items, dict):
        return items
    batch: Batch = {}
    for key in items[0]:
        if key in ("bad_files", "source_index"):
            continue
        values = [item[key] for item in items]
        batch[key] = torch.stack(values) if isinstance(values[0], torch.Tensor) else values
    batch["bad_files"] = [name for item in items for name in item.get("bad_files", ())]
    if all("source_index" in item for item in items):
        batch["source_index"] = [item["source_index"] for item in items]
    return batch


def first_items(batch: Batch, count: int) -> Batch:
    """The first ``count`` items of a collated ``batch``; its ``bad_files`` whole (they are the batch's, not an
    item's)."""
    return {key: value if key == "bad_files" else value[:count] for key, value in batch.items()}  # type: ignore[return-value]


class SkipUnreadable(Dataset):
    """Map-style base: item ``i`` is the first readable image at ``i, i+1, ...`` (wrapping), with the files passed
    over in ``"bad_files"``; when a view of the data set (one side of the held-out split) names the indices it may
    read, the replacement is the next readable one of those. Subclasses set the attributes below and implement
    ``read`` and ``name``.
    """

    path: str  # data.path, for the error message
    resolution: int
    crop: str
    horizontal_flip: bool

    def read(self, index: int) -> tuple[Image.Image, str]:
        """The fully decoded image and the caption of ``index``; raises one of ``UNREADABLE_ERRORS`` if unreadable."""
        raise NotImplementedError

    def name(self, index: int) -> str:
        """How the bad-file record names ``index`` (a file name, or a row number)."""
        raise NotImplementedError

    def prepare(self, image: Image.Image, size: int | tuple[int, int]) -> torch.Tensor:
        """What ``read`` gave, as the model's input at ``size``: an image's (3, H, W) uint8 (a source of clips
        prepares its frames alike)."""
        return to_model_input(image, size, self.crop, self.horizontal_flip)

    def image_size(self, index: int) -> tuple[int, int] | None:
        """(width, height) of ``index`` as decoded, without decoding it (what aspect-ratio buckets sort by); None
        when unreadable."""
        raise NotImplementedError

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.item(index)

    def item(
        self, index: int, size: tuple[int, int] | None = None, within: Sequence[int] | None = None
    ) -> dict[str, Any]:
        """Item ``index`` at ``size`` (height, width), default a ``resolution`` square. A skipped file's replacement
        is brought to the same size, so a batch of one bucket stays one bucket, and is taken from ``within`` (sorted
        indices that include ``index``) when given, so it stays on its side of the held-out split. ``source_index``
        is the item read: ``index``, or its replacement's (what a cache records, so no split moves an image).
        ``bad_files`` names only ``index``'s own file: a stand-in tried and found unreadable is counted when its own
        index is read, so each unreadable file counts once an epoch, however they cluster."""
        if not 0 <= index < len(self):
            raise IndexError(index)  # ends `for item in dataset`, which would otherwise wrap around forever
        bad, errors = [], []
        candidates = range(len(self)) if within is None else within
        start = bisect.bisect_left(candidates, index)
        tries = min(MAX_CONSECUTIVE_BAD, len(candidates))
        for offset in range(tries):
            current = candidates[(start + offset) % len(candidates)]
            try:  # the transform too: an image can decode and still fail to convert
                image, caption = self.read(current)
                prepared = self.prepare(image, size or self.resolution)
                item = {"image": prepared, "caption": caption, "source_index": current}
            except UNREADABLE_ERRORS as error:
                bad.append(describe_failure(self.name(current), error))
                errors.append(error)
                continue
            return {**item, "bad_files": bad[:1]} if bad else item
        first = "; ".join(bad[:3])
        if all(isinstance(e, UnfitFile) for e in errors) and len({(e.key, e.fix) for e in errors}) == 1:
            key, value, fix = errors[0].key, errors[0].value, errors[0].fix  # a setting's fault, not the files'
            raise ConfigError(key, value, f"none of the last {tries} files fits it (the first: {first})", fix)
        raise ConfigError(
            "data.path",
            self.path,
            f"every one of the last {tries} files was unreadable (the first: {first})",
            "check that `data.path` (and the image column) point at the images you meant, and that the files are "
            "complete",
        )
