"""Batches (``data/collate.py``): images stacked, captions listed, and the skipped files of every item gathered."""

import torch
from torch.utils.data import DataLoader

from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.shapes import ShapesDataset


def test_collate_batch_stacks_images_and_gathers_bad_files():
    items = [
        {"image": torch.zeros(3, 8, 8), "caption": "a"},
        {"image": torch.ones(3, 8, 8), "caption": "b", "bad_files": ["x.png: empty file", "y.png: file not found"]},
        {"image": torch.ones(3, 8, 8), "caption": "c", "bad_files": ["z.png: truncated"]},
    ]
    batch = collate_batch(items)
    assert batch["image"].shape == (3, 3, 8, 8) and batch["caption"] == ["a", "b", "c"]
    assert batch["bad_files"] == ["x.png: empty file", "y.png: file not found", "z.png: truncated"]
    assert collate_batch(items[:1])["bad_files"] == []
    shapes = next(iter(DataLoader(ShapesDataset(length=4, resolution=8), batch_size=4, collate_fn=collate_batch)))
    assert shapes["image"].shape == (4, 3, 8, 8) and shapes["bad_files"] == []
