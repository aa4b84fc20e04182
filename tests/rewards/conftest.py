"""A batch of shapes images and their captions, shared by the reward tests."""

import pytest
import torch
from torch.utils.data import DataLoader

from dit_trainer.data.sources.shapes import ShapesDataset


@pytest.fixture(scope="module")
def shapes_batch() -> tuple[torch.Tensor, list[str]]:
    batch = next(iter(DataLoader(ShapesDataset(48, seed=5), batch_size=48)))
    return (batch["image"] + 1) / 2, list(batch["caption"])
