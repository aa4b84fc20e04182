"""The reward protocol and the weighted sum that combines several reward functions.

A reward function maps images in [0, 1] with shape (B, 3, H, W) and their prompts to a float32 tensor of shape
(B,) on the images' device. It is pure and runs under ``torch.no_grad()``: rewards here are a monitoring signal
(and later the input of GRPO's advantages), never something to back-propagate through sampled images.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from dit_trainer.config import RewardConfig


class RewardFunction(Protocol):
    name: str

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor: ...


def no_models(cfg: RewardConfig) -> dict[str, str | None]:
    return {}


@dataclass(frozen=True)
class Reward:
    """An entry of ``REWARDS``: ``build(cfg, device, dtype)`` makes the reward function (its models loaded once,
    frozen, on ``device`` in ``dtype``); ``models(cfg)`` names the models it loads, by config key, so that an
    offline machine is told before training which are missing."""

    build: Callable[[RewardConfig, torch.device, torch.dtype], RewardFunction]
    models: Callable[[RewardConfig], dict[str, str | None]] = no_models
    # Whether it can score an image for a prompt (a judge of one data set reads only its captions): a prompt it
    # cannot is refused with the config, not found in a rollout's traceback.
    judges: Callable[[str], bool] = lambda prompt: True
    judged_prompts: str = ""  # what ``judges`` accepts, for the refusal: e.g. "a COLOUR SHAPE"
    # What it scores: images (B, 3, H, W), or clips (B, 3, F, H, W), what a video run (`data.frames` > 1) samples.
    takes: str = "images"


def check_reward_inputs(images: torch.Tensor, prompts: Sequence[str], clips: bool = False) -> None:
    """Fail with a readable message rather than deep inside a model when the protocol is not followed. A reward of
    ``clips`` takes (B, 3, F, H, W) clips too (a video run's samples)."""
    shape = "(B, 3, H, W) or clips (B, 3, F, H, W)" if clips else "(B, 3, H, W)"
    if images.ndim not in ((4, 5) if clips else (4,)) or images.shape[1] != 3:
        raise ValueError(f"this reward function takes images of shape {shape}, got {tuple(images.shape)}")
    if len(prompts) != images.shape[0]:
        raise ValueError(f"reward functions take one prompt per image: got {len(prompts)} for {images.shape[0]}")


class WeightedReward:
    """``sum_k weight_k * reward_k(images, prompts)``; ``scores`` also exposes each term, for per-reward logging."""

    name = "weighted"

    def __init__(self, terms: dict[str, tuple[float, RewardFunction]]) -> None:
        if not terms:
            raise ValueError("a WeightedReward needs at least one reward function")
        self.terms = terms

    @torch.no_grad()
    def scores(self, images: torch.Tensor, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Each reward function's (B,) scores, unweighted, by name (each checks whether it takes clips)."""
        check_reward_inputs(images, prompts, clips=True)
        return {name: reward(images, prompts).float() for name, (_, reward) in self.terms.items()}

    def combine(self, scores: dict[str, torch.Tensor]) -> torch.Tensor:
        """The weighted sum of ``scores`` (as returned by ``scores``): shape (B,)."""
        return sum(weight * scores[name] for name, (weight, _) in self.terms.items())

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.combine(self.scores(images, prompts))
