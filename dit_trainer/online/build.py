"""The shared parts of an online method's step from its section (a ``RolloutConfig``: ``grpo``, ``nft``), built
once for every method: the prompt sampler and the rewards-to-advantages feedback."""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch import nn

from dit_trainer.config import RewardConfig
from dit_trainer.config.online import RolloutConfig
from dit_trainer.online.feedback import GroupFeedback
from dit_trainer.online.prompts import PromptSampler
from dit_trainer.prompts import load_prompts
from dit_trainer.rewards.build import build_reward


def build_prompt_sampler(rollouts: RolloutConfig, section: str) -> PromptSampler:
    """The sampler of ``rollouts``' prompts (``section``: its config section, named by errors)."""
    prompts = load_prompts(rollouts.prompts, rollouts.prompt_file, f"{section}.")
    return PromptSampler(prompts, rollouts.prompts_per_epoch, rollouts.prompt_sampling)


def build_feedback(
    rollouts: RolloutConfig,
    section: str,
    reward: RewardConfig,
    accelerator: Accelerator,
    vae: nn.Module,
    frozen_dtype: torch.dtype,
) -> GroupFeedback:
    """Rewards (loaded in ``frozen_dtype``) and group advantages of ``rollouts``' images."""
    return GroupFeedback(
        accelerator,
        vae,
        build_reward(reward, accelerator.device, frozen_dtype),
        build_prompt_sampler(rollouts, section),
        group_size=rollouts.group_size,
        eps=rollouts.eps,
        advantage_std=rollouts.advantage_std,
        adv_clip_max=rollouts.adv_clip_max,
        batch_size=rollouts.rollout_batch_size,
    )
