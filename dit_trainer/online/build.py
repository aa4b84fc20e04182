"""The shared parts of an online method from its section (a ``RolloutConfig``: ``grpo``, ``nft``), built once for
every method: the prompt sampler, the rewards-to-advantages feedback and the gold-reward watch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn

from dit_trainer.config import DiffusionConfig, RewardConfig
from dit_trainer.config.online import RolloutConfig
from dit_trainer.diffusion.sampler import SamplerSettings
from dit_trainer.online.feedback import GroupFeedback
from dit_trainer.online.gold import GoldJudge, GoldWatch
from dit_trainer.online.prompts import PromptSampler
from dit_trainer.prompts import load_prompts
from dit_trainer.rewards.base import WeightedReward
from dit_trainer.rewards.build import build_reward
from dit_trainer.training.monitors.monitors import MonitorContext, SamplingPlan


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


def build_gold_watch(
    rollouts: RolloutConfig,
    section: str,
    reward: RewardConfig,
    diffusion: DiffusionConfig,
    context: MonitorContext,
    out_dir: Path,
    training_reward: WeightedReward,
    frozen_dtype: torch.dtype,
) -> GoldWatch:
    """The watch of ``rollouts.gold_reward`` on the held-out prompts, sampled as ``diffusion`` samples; the gold
    reward is loaded on the main process only (the others never score)."""
    accelerator = context.accelerator
    rewards = None
    if accelerator.is_main_process:
        gold = dataclasses.replace(reward, weights={str(rollouts.gold_reward): 1.0})
        rewards = (build_reward(gold, accelerator.device, frozen_dtype), training_reward)
    plan = SamplingPlan(
        load_prompts(rollouts.gold_prompts, rollouts.gold_prompt_file, f"{section}.gold_"),
        rollouts.gold_images,
        rollouts.gold_seed,
        SamplerSettings(diffusion.sample_steps, diffusion.guidance_scale, diffusion.sampler),
        rollouts.rollout_batch_size,
    )
    judge = GoldJudge(str(rollouts.gold_reward), rollouts.gold_stop_margin, f"{section}.gold_stop_margin")
    return GoldWatch(context, plan, out_dir, rollouts.gold_every, rewards, judge)
