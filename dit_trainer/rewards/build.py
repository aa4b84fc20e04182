"""Reward functions from the ``reward`` config: each model loaded once, frozen, on the device in ``dtype``."""

from __future__ import annotations

import torch

from dit_trainer.config import RewardConfig, validate_reward
from dit_trainer.rewards.base import RewardFunction, WeightedReward
from dit_trainer.rewards.clip import load_clip_score
from dit_trainer.rewards.jpeg import JPEGCompressibilityReward
from dit_trainer.rewards.shapes import ShapesAlignmentReward


def _build_one(name: str, cfg: RewardConfig, device: torch.device, dtype: torch.dtype) -> RewardFunction:
    if name == "clip_score":
        return load_clip_score(cfg.clip_model, device, dtype, cfg.clip_revision)
    if name == "jpeg_compressibility":
        return JPEGCompressibilityReward(cfg.jpeg_quality)
    return ShapesAlignmentReward()


def build_reward(cfg: RewardConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> WeightedReward:
    """The weighted sum of the configured reward functions (one term when a single reward is configured)."""
    validate_reward(cfg, required=True)
    return WeightedReward(
        {name: (weight, _build_one(name, cfg, device, dtype)) for name, weight in cfg.weights.items()}
    )
