"""A GRPO run's parts from its config: the epoch settings, the stochastic policy with its window of trained steps,
and the reference policy of the KL penalty."""

from __future__ import annotations

import torch

from dit_trainer.config import TrainConfig
from dit_trainer.diffusion import NoiseSchedule
from dit_trainer.diffusion.policy import StochasticPolicy
from dit_trainer.grpo.prompts import PromptSampler
from dit_trainer.grpo.trainer import GRPOSettings
from dit_trainer.prompts import load_prompts


def grpo_settings(cfg: TrainConfig) -> GRPOSettings:
    g = cfg.grpo
    return GRPOSettings(
        prompts=load_prompts(g.prompts, g.prompt_file, "grpo."),
        prompts_per_epoch=g.prompts_per_epoch,
        group_size=g.group_size,
        guidance_scale=cfg.diffusion.guidance_scale if g.guidance_scale is None else g.guidance_scale,
        clip_range=g.clip_range,
        adv_clip_max=g.adv_clip_max,
        advantage_std=g.advantage_std,
        filter_zero_std=g.filter_zero_std,
        beta=g.beta,
        minibatches=g.minibatches,
        passes=g.passes,
        rollout_batch_size=g.rollout_batch_size,
        eps=g.eps,
        steps_per_trajectory=g.steps_per_trajectory,
        train_unconditional=g.train_unconditional,
    )


def build_prompt_sampler(cfg: TrainConfig) -> PromptSampler:
    g = cfg.grpo
    return PromptSampler(len(load_prompts(g.prompts, g.prompt_file, "grpo.")), g.prompts_per_epoch, g.prompt_sampling)


def build_policy(cfg: TrainConfig, schedule: NoiseSchedule, device: torch.device) -> StochasticPolicy:
    """The schedule family's stochastic sampler over ``grpo.sample_steps``, noise only in the configured window and
    never in the last step (its noise would stay in the image; DDIM's has no variance when K divides T)."""
    g = cfg.grpo
    window = torch.zeros(g.sample_steps, dtype=torch.bool)
    window[g.sde_start : g.sample_steps - 1 if g.sde_steps is None else g.sde_start + g.sde_steps] = True
    return schedule.policy(g.sample_steps, device, g.noise_level, window.to(device))
