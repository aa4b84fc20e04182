"""JPEG compressibility (``rewards/jpeg.py``): simpler images score higher."""

import torch

from dit_trainer.rewards.jpeg import JPEGCompressibilityReward


def test_jpeg_compressibility_prefers_simple_images():
    flat = torch.full((2, 3, 32, 32), 0.5)
    noise = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    reward = JPEGCompressibilityReward(quality=95)
    scores = reward(torch.cat([flat, noise]), ["a", "b", "c", "d"])
    assert scores.shape == (4,) and (scores <= 0).all()
    assert scores[:2].min() > scores[2:].max()
