"""Reward functions from the ``reward`` config: each model loaded once, frozen, on the device in ``dtype``; and the
``reward`` section's checks."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from dit_trainer.config import DataConfig, MonitorConfig, RewardConfig
from dit_trainer.errors import ConfigError
from dit_trainer.hub import require_offline_copy
from dit_trainer.rewards import REWARDS
from dit_trainer.rewards.base import WeightedReward


def check_reward_weights(weights: Mapping[str, float], required: bool = True) -> None:
    """Known names and finite weights; with ``required`` (something will score images) at least one reward."""
    for name, weight in weights.items():
        if name not in REWARDS:
            raise ConfigError(
                f"reward.weights.{name}",
                weight,
                f"`{name}` is not a reward function; the known ones are {', '.join(REWARDS)} (or "
                "`package.module:REWARD` for one of your own)",
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
    if required and not any(weights.values()):  # every image would score 0: nothing to tell apart or learn
        raise ConfigError(
            "reward.weights",
            dict(weights),
            "every weight is 0, so every image would score 0 and no reward could rank one above another",
            "give at least one reward a non-zero weight, e.g. `reward.weights.shapes_alignment=1.0`",
        )


def check_rewards_take(weights: Mapping[str, float], frames: int, prefix: str = "reward.weights") -> None:
    """Each reward scores what the run samples: images, or clips of ``data.frames`` > 1 frames (found at the first
    scoring otherwise, after the steps before it)."""
    samples = "clips" if frames > 1 else "images"
    for name, weight in weights.items():
        takes = REWARDS.get(name, f"{prefix}.{name}").takes
        if takes != samples:
            fitting = [other for other in REWARDS if REWARDS.get(other, prefix).takes == samples]
            raise ConfigError(
                f"{prefix}.{name}",
                weight,
                f"`{name}` scores {takes}, and this run samples {samples} (`data.frames={frames}`)",
                f"score its {samples} with {' or '.join(f'`{other}`' for other in fitting) or 'a reward of your own'}",
            )


def check_rewards(reward: RewardConfig, monitor: MonitorConfig, data: DataConfig, method_scores: bool = False) -> None:
    """The configured rewards, and, when a run scores its samples (the reward monitor, or a method that trains on
    rewards: ``method_scores``), that they score what it samples and every model they load is on this machine under
    HF_HUB_OFFLINE=1."""
    scoring = monitor.reward.enabled or method_scores
    check_reward_weights(reward.weights, required=scoring)
    if not scoring:
        return
    check_rewards_take(reward.weights, data.frames)
    for name in reward.weights:
        kind = REWARDS.get(name, f"reward.weights.{name}")
        for key, name_or_path in kind.models(reward).items():
            if name_or_path:
                require_offline_copy(str(name_or_path), key)


def build_reward(cfg: RewardConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> WeightedReward:
    """The weighted sum of the configured reward functions (one term when a single reward is configured)."""
    check_reward_weights(cfg.weights)
    return WeightedReward(
        {
            name: (weight, REWARDS.get(name, f"reward.weights.{name}").build(cfg, device, dtype))
            for name, weight in cfg.weights.items()
        }
    )
