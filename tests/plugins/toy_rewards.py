"""A reward that lives outside dit-trainer, named by import path (``toy_rewards:IMAGE_DETAIL``): how much detail an
image holds, the spread of its pixel values. Training on ``jpeg_compressibility`` alone flattens images, and this
falls as it does: a gold reward that a tiny, barely trained model can already move, for the watch's tests."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dit_trainer.rewards.base import Reward, check_reward_inputs


def image_detail(images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
    """(B,) the standard deviation of each image's pixel values, in [0, 0.5]."""
    check_reward_inputs(images, prompts)
    return images.float().flatten(1).std(dim=1)


IMAGE_DETAIL = Reward(lambda cfg, device, dtype: image_detail)


def out_of_memory(images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
    """Raises as a reward model that runs out of memory does: a monitor that fails, for the trainer's tests."""
    raise MemoryError("the reward model ran out of memory")


OUT_OF_MEMORY = Reward(lambda cfg, device, dtype: out_of_memory)
