"""Aspect-ratio buckets: each image is trained at the (height, width) of the bucket nearest its aspect ratio, all
buckets holding about ``resolution``² pixels, instead of being centre-cropped to a square.

``data.buckets`` is ``none`` (squares, as always), ``pixart`` (PixArt's published bin table: exactly its 256, 512 and
1024 px tables, and at any other resolution the nearest of them scaled and rounded), or a list of ``[height, width]``
pairs. Every side is a multiple of the VAE's downsampling factor x the DiT's patch size, so a bucket's latent cuts
into whole patches.

A random-access source is wrapped in ``Bucketed`` (each item's bucket from its image size: declared by the data, or
read from its header once into a sizes index in the run's or the cache's folder, ``image_sizes``; the batch plan of
``batch_plan`` then keeps every batch to one bucket); a stream in ``BucketedStream``, which assembles single-bucket
batches as it reads (each image in the bucket of its decoded size: no sizes needed beforehand). ``in_order_loader``
reads either bucket by bucket, for caches and validation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from dit_trainer.data.collate import collate_batch
from dit_trainer.data.image_sizes import image_sizes
from dit_trainer.data.seeded_items import SeededItems
from dit_trainer.errors import ConfigError

Size = tuple[int, int]  # (height, width) in pixels


def pixart_tables() -> dict[int, list[Size]]:
    """PixArt's bin tables by base resolution, as diffusers ships them ({"h/w": [height, width]})."""
    from diffusers.pipelines.pixart_alpha.pipeline_pixart_alpha import (
        ASPECT_RATIO_256_BIN,
        ASPECT_RATIO_512_BIN,
        ASPECT_RATIO_1024_BIN,
    )

    tables = {256: ASPECT_RATIO_256_BIN, 512: ASPECT_RATIO_512_BIN, 1024: ASPECT_RATIO_1024_BIN}
    return {base: [(int(h), int(w)) for h, w in table.values()] for base, table in tables.items()}


def pixart_buckets(resolution: int, multiple: int) -> list[Size]:
    """PixArt's table for ``resolution``: the published one at 256, 512 and 1024 px; elsewhere the table nearest in
    scale, scaled to ``resolution`` and rounded to multiples of ``multiple`` (duplicates that rounding makes are
    dropped). A published size that ``multiple`` does not divide is rounded too."""
    tables = pixart_tables()
    base = min(tables, key=lambda size: abs(math.log(size / resolution)))
    scale = resolution / base
    sizes = [tuple(max(multiple, round(side * scale / multiple) * multiple) for side in size) for size in tables[base]]
    return list(dict.fromkeys(sizes))


@dataclass(frozen=True)
class BucketTable:
    """The buckets of a run, and the rule that puts an image in one: the bucket whose aspect ratio is nearest the
    image's, measured as |log(h/w) - log(H/W)| (so 2:1 and 1:2 are equally far from 1:1)."""

    sizes: tuple[Size, ...]

    def nearest(self, width: int, height: int) -> int:
        """The index of the bucket for an image of ``width`` x ``height`` pixels (ties: the first listed)."""
        ratio = math.log(height / width)
        return min(range(len(self.sizes)), key=lambda i: abs(math.log(self.sizes[i][0] / self.sizes[i][1]) - ratio))

    def assign(self, image_sizes: Sequence[tuple[int, int] | None]) -> list[int]:
        """Each image's bucket from its (width, height); an image whose size could not be read (it will be skipped
        as unreadable when its turn comes) goes to the squarest bucket."""
        square = self.nearest(1, 1)
        return [square if size is None else self.nearest(*size) for size in image_sizes]

    def describe(self, assignment: Sequence[int]) -> str:
        """``32x32: 120, 24x40: 80`` for the buckets that hold images, in table order."""
        counts = [0] * len(self.sizes)
        for bucket in assignment:
            counts[bucket] += 1
        return ", ".join(f"{h}x{w}: {n}" for (h, w), n in zip(self.sizes, counts) if n)


def bucket_table(spec: Any, resolution: int, multiple: int, key: str = "data.buckets") -> BucketTable | None:
    """The table ``data.buckets`` asks for (None for ``none``); a listed size that ``multiple`` does not divide is a
    ``ConfigError`` naming it."""
    if spec == "none":
        return None
    if spec == "pixart":
        return BucketTable(tuple(pixart_buckets(resolution, multiple)))
    sizes = [(int(h), int(w)) for h, w in spec]
    bad = [size for size in sizes if size[0] % multiple or size[1] % multiple]
    if bad:
        h, w = bad[0]
        rounded = [max(multiple, round(side / multiple) * multiple) for side in (h, w)]
        raise ConfigError(
            key,
            [list(size) for size in sizes],
            f"the bucket {h}x{w} is not a multiple of {multiple} (the VAE's downsampling factor x the DiT's patch "
            "size) on both sides, so its latent would not cut into whole patches",
            f"use e.g. [{rounded[0]}, {rounded[1]}] instead",
        )
    return BucketTable(tuple(dict.fromkeys(sizes)))


def require_table_of(spec: Any, table: BucketTable | None) -> None:
    """A caller's mistake, not a user's: a table handed in for ``data.buckets=none``, or none for buckets (which
    would train squares, or fingerprint a cache without its sizes). The table comes from
    ``components.geometry.configured_buckets``."""
    if (table is None) != (spec == "none"):
        raise ValueError(f"bucket table {table} for data.buckets={spec!r}: pass configured_buckets(model, vae, data)")


class Bucketed(Dataset):
    """A map-style source whose item ``i`` comes at its bucket's size. ``buckets`` (one bucket index per item) comes
    from the images' sizes (``image_sizes``: every process of the run builds it, the headers it reads kept in the
    sizes index of ``sizes_dir``), or is passed in when another view of the same data (the unaugmented copy that
    validation reads) has them already."""

    def __init__(
        self,
        dataset: Dataset,
        table: BucketTable,
        buckets: Sequence[int] | None = None,
        show_progress: bool = False,
        sizes_dir: Path | None = None,
    ) -> None:
        self.dataset, self.table = dataset, table
        if buckets is None:
            buckets = table.assign(image_sizes(dataset, sizes_dir, show_progress))
        self.buckets = list(buckets)

    def __len__(self) -> int:
        return len(self.buckets)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.item(index)

    def item(self, index: int, size: Size | None = None, within: Sequence[int] | None = None) -> dict[str, Any]:
        """Item ``index`` at its bucket's size (``size`` is the bucket's to decide); ``within`` as the source's."""
        return self.dataset.item(index, self.table.sizes[self.buckets[index]], within)


class BucketedStream(IterableDataset):
    """A stream (webdataset) read into batches of one bucket: each decoded image joins its bucket's buffer, and a
    full buffer leaves as a collated batch (the DataLoader batches nothing itself: ``batch_size=None``). When the
    stream ends, the buffers' incomplete batches follow, or with ``drop_incomplete`` (training) are dropped, as a
    DataLoader's last batch is; the bad-file records on dropped items ride on the last batch, so none is lost."""

    def __init__(self, stream: IterableDataset, table: BucketTable, batch_size: int, drop_incomplete: bool) -> None:
        self.stream, self.table, self.batch_size, self.drop_incomplete = stream, table, batch_size, drop_incomplete

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    def bucket_size(self, image: Image.Image) -> Size:
        return self.table.sizes[self.table.nearest(*image.size)]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        buffers: dict[tuple[int, ...], list[dict[str, Any]]] = {}
        ready: dict[str, Any] | None = None  # held back one batch, to carry the records of dropped items
        for item in self.stream.items(self.bucket_size):
            buffer = buffers.setdefault(tuple(item["image"].shape), [])
            buffer.append(item)
            if len(buffer) == self.batch_size:
                if ready is not None:
                    yield ready
                ready = collate_batch(buffer)
                buffer.clear()
        tails = [collate_batch(buffer) for buffer in buffers.values() if buffer]
        if self.drop_incomplete and ready is not None:
            ready["bad_files"] += [name for tail in tails for name in tail["bad_files"]]
            tails = []
        yield from ([ready] if ready is not None else []) + tails


def bucketed(
    dataset: Dataset,
    table: BucketTable | None,
    batch_size: int,
    drop_incomplete: bool = False,
    show_progress: bool = False,
    sizes_dir: Path | None = None,
) -> Dataset:
    """``dataset`` with its items at their buckets' sizes (a stream: as batches of ``batch_size``, the incomplete
    ones dropped or not); unchanged without buckets. ``sizes_dir``: where the images' sizes index is kept (the run's
    or the cache's folder; None: sizes a header scan finds are not kept)."""
    if table is None:
        return dataset
    if isinstance(dataset, IterableDataset):
        return BucketedStream(dataset, table, batch_size, drop_incomplete)
    return Bucketed(dataset, table, show_progress=show_progress, sizes_dir=sizes_dir)


def per_item(dataset: Dataset, attribute: str) -> list | None:
    """A per-item list ``attribute`` (``buckets``, ``sources``) of ``dataset`` or of the data set it views (a
    ``Subset``, a ``Bucketed`` or ``SeededItems`` wrapper), in ``dataset``'s item order; None where no layer has
    it."""
    if isinstance(dataset, Subset):
        values = per_item(dataset.dataset, attribute)
        return None if values is None else [values[index] for index in dataset.indices]
    values = getattr(dataset, attribute, None)
    if values is None and isinstance(dataset, (Bucketed, SeededItems)):
        return per_item(dataset.dataset, attribute)
    return values


def item_buckets(dataset: Dataset) -> list[int] | None:
    """The bucket of each item of ``dataset`` (a bucketed source, a latent cache of one, or a ``Subset`` of
    either); None for square data."""
    return per_item(dataset, "buckets")


def in_order_batches(buckets: Sequence[int], batch_size: int) -> list[list[int]]:
    """Every index once, in batches of one bucket each (the last of a bucket may be short): how caches and
    validation read bucketed data, where the order must not depend on a seed."""
    members: dict[int, list[int]] = {}
    for index, bucket in enumerate(buckets):
        members.setdefault(bucket, []).append(index)
    return [items[i : i + batch_size] for _, items in sorted(members.items()) for i in range(0, len(items), batch_size)]


def in_order_loader(dataset: Dataset, batch_size: int, num_workers: int = 0) -> DataLoader:
    """A loader that reads every item of ``dataset`` once in batches of one bucket: bucket by bucket for bucketed
    data (its ``batch_sampler`` lists the indices in reading order), in order for square data."""
    if isinstance(dataset, BucketedStream):  # it batches itself
        return DataLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=collate_batch)
    buckets = item_buckets(dataset)
    if buckets is None:
        return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_batch)
    batches = in_order_batches(buckets, batch_size)
    return DataLoader(dataset, batch_sampler=batches, num_workers=num_workers, collate_fn=collate_batch)
