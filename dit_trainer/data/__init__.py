"""Data sources: each yields ``{"image": (3, H, W) in [-1, 1], "caption": str}``, plus ``"bad_files"`` (the
unreadable files skipped to produce it) when there were any; ``collate_batch`` turns items into batches."""

from __future__ import annotations

from torch.utils.data import Dataset

from dit_trainer.config import DataConfig
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.hf import HFImageDataset
from dit_trainer.data.imagefolder import ImageFolderDataset
from dit_trainer.data.shapes import ShapesDataset
from dit_trainer.data.webdataset import WebDatasetSource


def build_dataset(cfg: DataConfig) -> Dataset:
    """The source ``cfg.source`` names. ``webdataset`` is an ``IterableDataset`` (no ``len``), sharded by the
    torch.distributed rank of this process; the others are map-style."""
    style = {"crop": cfg.crop, "horizontal_flip": cfg.horizontal_flip, "caption_columns": cfg.caption_columns}
    if cfg.source == "imagefolder":
        return ImageFolderDataset(cfg.path, cfg.resolution, cfg.caption_column, **style)
    if cfg.source == "hf":
        return HFImageDataset(cfg.path, cfg.resolution, cfg.split, cfg.image_column, cfg.caption_column, **style)
    if cfg.source == "webdataset":
        return WebDatasetSource(
            cfg.path, cfg.resolution, cfg.caption_column, seed=cfg.seed, shuffle_buffer=cfg.shuffle_buffer, **style
        )
    return ShapesDataset(length=cfg.length, resolution=cfg.resolution, seed=cfg.seed)


__all__ = [
    "HFImageDataset",
    "ImageFolderDataset",
    "ShapesDataset",
    "WebDatasetSource",
    "build_dataset",
    "collate_batch",
]
