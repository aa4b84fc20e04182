"""Data sources: each yields ``{"image": (3, H, W) in [-1, 1], "caption": str}``, plus ``"bad_files"`` (the
unreadable files skipped to produce it) when there were any; ``collate_batch`` turns items into batches.

``SOURCES`` is the registry ``data.source`` names: adding a source is its module, one entry here and one YAML file
in ``configs/data/``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch.utils.data import Dataset

from dit_trainer.data.collate import collate_batch
from dit_trainer.data.hf import HFImageDataset, split_fingerprint
from dit_trainer.data.imagefolder import ImageFolderDataset, check_image_folder, metadata_fingerprint
from dit_trainer.data.mixture import MixtureDataset, entry_config, source_names
from dit_trainer.data.shapes import ShapesDataset
from dit_trainer.data.webdataset import WebDatasetSource, shards_fingerprint
from dit_trainer.registry import lookup

if TYPE_CHECKING:
    from dit_trainer.config import DataConfig


@dataclass(frozen=True)
class Source:
    """How to build a source from ``DataConfig``, and what its ``data.path`` must be (None: it takes none)."""

    build: Callable[[DataConfig], Dataset]
    path_meaning: str | None = None  # completes "`data=NAME` needs ..."
    path_example: str | None = None
    check_path: Callable[[str, str], None] | None = None  # (path, its key): a cheap check before any model is built
    streamed: bool = False  # an IterableDataset: no random access (so no Poisson sampling for DP)
    bucketed: bool = False  # its items can come at any (height, width) and it reads image sizes: `data.buckets`
    # What identifies the data beyond its config, for the cache fingerprint: cheap (no image is read), so None
    # where the config alone determines the data (shapes).
    content: Callable[[DataConfig], dict] | None = None


def _style(cfg: DataConfig) -> dict:
    return {"crop": cfg.crop, "horizontal_flip": cfg.horizontal_flip, "caption_columns": cfg.caption_columns}


def _shapes(cfg: DataConfig) -> Dataset:
    return ShapesDataset(length=cfg.length, resolution=cfg.resolution, seed=cfg.seed)


def _imagefolder(cfg: DataConfig) -> Dataset:
    return ImageFolderDataset(cfg.path, cfg.resolution, cfg.caption_column, **_style(cfg))


def _hf(cfg: DataConfig) -> Dataset:
    return HFImageDataset(cfg.path, cfg.resolution, cfg.split, cfg.image_column, cfg.caption_column, **_style(cfg))


def _webdataset(cfg: DataConfig) -> Dataset:
    return WebDatasetSource(
        cfg.path, cfg.resolution, cfg.caption_column, seed=cfg.seed, shuffle_buffer=cfg.shuffle_buffer, **_style(cfg)
    )


SOURCES: dict[str, Source] = {
    "shapes": Source(_shapes),
    "imagefolder": Source(
        _imagefolder,
        "the folder that holds your images and metadata.jsonl",
        "/path/to/images",
        check_image_folder,
        bucketed=True,
        content=lambda cfg: metadata_fingerprint(cfg.path),
    ),
    "hf": Source(
        _hf,
        "a dataset name on the hub or a folder written by `Dataset.save_to_disk`",
        "/path/to/dataset",
        bucketed=True,
        content=lambda cfg: split_fingerprint(cfg.path, cfg.split),
    ),
    "webdataset": Source(
        _webdataset,
        "tar shards in brace notation",
        "'/data/shards/{000000..000099}.tar'",
        streamed=True,
        bucketed=True,
        content=lambda cfg: shards_fingerprint(cfg.path),
    ),
}


def build_dataset(cfg: DataConfig) -> Dataset:
    """The source ``cfg.source`` names, or the mixture of ``cfg.mixture``'s. ``webdataset`` is an
    ``IterableDataset`` (no ``len``), sharded by the torch.distributed rank of this process; the others are
    map-style."""
    if cfg.mixture:
        entries = [build_dataset(entry_config(cfg, entry)) for entry in cfg.mixture]
        return MixtureDataset(entries, source_names(cfg.mixture))
    return lookup(SOURCES, "data.source", cfg.source).build(cfg)


__all__ = [
    "SOURCES",
    "HFImageDataset",
    "ImageFolderDataset",
    "ShapesDataset",
    "Source",
    "WebDatasetSource",
    "build_dataset",
    "collate_batch",
]
