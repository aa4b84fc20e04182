"""The reward protocol and the weighted sum (``rewards/base.py``): each term kept, the sum weighted, and inputs that
break the protocol refused."""

import pytest
import torch

from dit_trainer.config import RewardConfig
from dit_trainer.rewards.base import WeightedReward
from dit_trainer.rewards.build import build_reward
from dit_trainer.rewards.jpeg import JPEGCompressibilityReward
from dit_trainer.rewards.shapes import ShapesAlignmentReward

CPU = torch.device("cpu")


def test_weighted_reward_sums_its_terms_and_keeps_each(shapes_batch):
    images, captions = shapes_batch
    reward = build_reward(RewardConfig(weights={"shapes_alignment": 2.0, "jpeg_compressibility": 0.1}), CPU)
    scores = reward.scores(images, captions)
    assert set(scores) == {"shapes_alignment", "jpeg_compressibility"}
    expected = 2.0 * ShapesAlignmentReward()(images, captions) + 0.1 * JPEGCompressibilityReward()(images, captions)
    torch.testing.assert_close(reward(images, captions), expected)


def test_rewards_refuse_inputs_that_break_the_protocol():
    reward = WeightedReward({"shapes_alignment": (1.0, ShapesAlignmentReward())})
    with pytest.raises(ValueError, match="one prompt per image"):
        reward(torch.rand(2, 3, 8, 8), ["only one"])
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        reward(torch.rand(2, 8, 8), ["a", "b"])
