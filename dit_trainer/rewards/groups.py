"""Group statistics of rewards: G images per prompt, normalised within each prompt's group (GRPO's advantages, the
reward monitor's and evaluate.py's spread within a prompt; named for the groups, not for GRPO alone).

This is the shape flow_grpo and DanceGRPO use: advantage = (r - mean_prompt) / (std_prompt + eps), plus the
variant that divides by the global std instead. Groups whose rewards are all equal carry no learning signal
(their advantages are 0), so the fraction of such groups is the first thing to watch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GroupStatistics:
    """For ``P`` prompts x ``G`` images, flattened prompt-major (image ``i`` belongs to prompt ``i // G``)."""

    mean: torch.Tensor  # (P,) per-prompt mean reward
    std: torch.Tensor  # (P,) per-prompt population std
    advantages: torch.Tensor  # (P*G,) (r - mean) / (std + eps), per prompt
    advantages_global_std: torch.Tensor  # (P*G,) (r - mean) / (global std + eps)
    zero_std_fraction: float  # share of prompts whose G rewards are all equal


def group_statistics(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> GroupStatistics:
    """Statistics of ``rewards`` (P*G,) in groups of ``group_size`` consecutive images. Stds are population
    stds (divide by G), as in the GRPO reference implementations."""
    if rewards.ndim != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"expected a flat tensor of P x {group_size} rewards, got shape {tuple(rewards.shape)}")
    groups = rewards.float().view(-1, group_size)
    # A group of equal rewards has mean = its reward and std 0 exactly (the float mean of equal values can be off
    # by a rounding error, which the eps division would turn into an advantage).
    equal = (groups == groups[:, :1]).all(dim=1)
    mean = torch.where(equal, groups[:, 0], groups.mean(dim=1))
    std = torch.where(equal, 0.0, groups.std(dim=1, correction=0))
    centred = groups - mean[:, None]
    global_std = groups.std(correction=0)
    return GroupStatistics(
        mean=mean,
        std=std,
        advantages=(centred / (std[:, None] + eps)).flatten(),
        advantages_global_std=(centred / (global_std + eps)).flatten(),
        zero_std_fraction=equal.float().mean().item(),
    )


def reward_metrics(
    scores: dict[str, torch.Tensor], rewards: torch.Tensor, group_size: int, eps: float = 1e-4
) -> dict[str, float]:
    """What the reward monitor logs and the evaluation reports: ``reward/mean``, ``reward/std``, ``reward/<name>``
    per reward function (unweighted), and the GRPO group statistics of the combined ``rewards``."""
    stats = group_statistics(rewards, group_size, eps)
    return {
        "reward/mean": rewards.float().mean().item(),
        "reward/std": rewards.float().std(correction=0).item(),
        **{f"reward/{name}": values.float().mean().item() for name, values in scores.items()},
        "grpo/adv_abs_mean": stats.advantages.abs().mean().item(),
        "grpo/adv_abs_mean_global_std": stats.advantages_global_std.abs().mean().item(),
        "grpo/group_std_mean": stats.std.mean().item(),
        "grpo/zero_std_frac": stats.zero_std_fraction,
    }
