"""Rewards of generated images, behind one protocol: ``reward(images [0, 1] (B, 3, H, W), prompts) -> (B,)``."""

from dit_trainer.rewards.base import RewardFunction, WeightedReward
from dit_trainer.rewards.build import REWARDS, build_reward, check_reward_weights
from dit_trainer.rewards.clip import CLIPScoreReward, load_clip_score
from dit_trainer.rewards.grpo import GroupStatistics, group_statistics, reward_metrics
from dit_trainer.rewards.jpeg import JPEGCompressibilityReward
from dit_trainer.rewards.shapes import ShapesAlignmentReward

__all__ = [
    "REWARDS",
    "CLIPScoreReward",
    "GroupStatistics",
    "JPEGCompressibilityReward",
    "RewardFunction",
    "ShapesAlignmentReward",
    "WeightedReward",
    "build_reward",
    "check_reward_weights",
    "group_statistics",
    "load_clip_score",
    "reward_metrics",
]
