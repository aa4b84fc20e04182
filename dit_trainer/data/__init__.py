"""Data sources: each yields ``{"image": (3, H, W) in [-1, 1], "caption": str}``."""

from __future__ import annotations

from torch.utils.data import Dataset

from dit_trainer.config import DataConfig
from dit_trainer.data.imagefolder import ImageFolderDataset
from dit_trainer.data.shapes import ShapesDataset


def build_dataset(cfg: DataConfig) -> Dataset:
    if cfg.source == "imagefolder":
        return ImageFolderDataset(cfg.path, cfg.resolution, cfg.caption_column, cfg.center_crop)
    return ShapesDataset(length=cfg.length, resolution=cfg.resolution, seed=cfg.seed)


__all__ = ["ImageFolderDataset", "ShapesDataset", "build_dataset"]
