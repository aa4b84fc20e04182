"""Reward functions from the ``reward`` config: each model loaded once, frozen, on the device in ``dtype``.

``REWARDS`` is the registry ``reward.weights`` names: adding a reward is its module, one entry here and one YAML
file in ``configs/reward/``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from dit_trainer.errors import ConfigError
from dit_trainer.rewards.base import RewardFunction, WeightedReward
from dit_trainer.rewards.clip import load_clip_score
from dit_trainer.rewards.digits import DigitAccuracyReward
from dit_trainer.rewards.jpeg import JPEGCompressibilityReward
from dit_trainer.rewards.shapes import ShapesAlignmentReward, ShapesMarginReward

if TYPE_CHECKING:
    from dit_trainer.config import RewardConfig

RewardBuilder = Callable[["RewardConfig", torch.device, torch.dtype], RewardFunction]

REWARDS: dict[str, RewardBuilder] = {
    "shapes_alignment": lambda cfg, device, dtype: ShapesAlignmentReward(),
    "shapes_margin": lambda cfg, device, dtype: ShapesMarginReward(),
    "clip_score": lambda cfg, device, dtype: load_clip_score(cfg.clip_model, device, dtype, cfg.clip_revision),
    "jpeg_compressibility": lambda cfg, device, dtype: JPEGCompressibilityReward(cfg.jpeg_quality),
    "digit_accuracy": lambda cfg, device, dtype: DigitAccuracyReward(),
}


def check_reward_weights(weights: Mapping[str, float], required: bool = True) -> None:
    """Known names and finite weights; with ``required`` (something will score images) at least one reward."""
    for name, weight in weights.items():
        if name not in REWARDS:
            raise ConfigError(
                f"reward.weights.{name}",
                weight,
                f"`{name}` is not a reward function; the known ones are {', '.join(REWARDS)}",
                "remove it, or pick one of those, e.g. `reward=clip_score` or `reward.weights={shapes_alignment:1.0}`",
            )
        if not math.isfinite(weight):
            raise ConfigError(f"reward.weights.{name}", weight, "a weight must be a finite number")
    if required and not weights:
        raise ConfigError(
            "reward.weights",
            dict(weights),
            "no reward function is configured, so there is nothing to score the images with",
            f"pick a config group option such as `reward=shapes_alignment` (options: {', '.join(REWARDS)}, multi)",
        )


def build_reward(cfg: RewardConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> WeightedReward:
    """The weighted sum of the configured reward functions (one term when a single reward is configured)."""
    check_reward_weights(cfg.weights)
    return WeightedReward({name: (weight, REWARDS[name](cfg, device, dtype)) for name, weight in cfg.weights.items()})
