"""The shapes judge as rewards (``rewards/shapes.py``): true captions score high, wrong ones low."""

import torch

from dit_trainer.config import RewardConfig
from dit_trainer.data.sources.shapes import COLORS, SHAPES
from dit_trainer.rewards.build import build_reward
from dit_trainer.rewards.shapes import ShapesAlignmentReward

CPU = torch.device("cpu")


def _mismatched(caption: str) -> str:
    """Another colour and another shape than the caption's."""
    color, shape = caption.removeprefix("a ").split(" ")
    colors, shapes = list(COLORS), list(SHAPES)
    return f"a {colors[(colors.index(color) + 1) % len(colors)]} {shapes[(shapes.index(shape) + 1) % len(shapes)]}"


def test_shapes_alignment_scores_true_captions_high_and_wrong_ones_low(shapes_batch):
    images, captions = shapes_batch
    reward = ShapesAlignmentReward()
    true_scores = reward(images, captions)
    assert true_scores.shape == (48,) and true_scores.dtype == torch.float32
    assert true_scores.mean() >= 0.95
    assert reward(images, [_mismatched(c) for c in captions]).mean() <= 0.2
    assert ((true_scores >= 0) & (true_scores <= 1)).all()


def test_shapes_margin_is_built_by_name_and_separates_true_captions_from_wrong_ones(shapes_batch):
    images, captions = shapes_batch
    margin = build_reward(RewardConfig(weights={"shapes_margin": 1.0}), CPU)
    true_margins = margin(images, captions)
    assert true_margins.shape == (48,) and true_margins.dtype == torch.float32
    assert (true_margins > 0).all() and (margin(images, [_mismatched(c) for c in captions]) < 0).all()
