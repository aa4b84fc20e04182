"""A GRPO run's parts from its config: the epoch settings, the stochastic policy with its window of trained steps,
the reference policy of the KL penalty, and the ``GRPOTrainer`` on the training loop's parts."""

from __future__ import annotations

import torch
from accelerate import Accelerator

from dit_trainer.components.build import Components
from dit_trainer.components.dit import DiTAdapter
from dit_trainer.config import TrainConfig
from dit_trainer.diffusion.policy import StochasticPolicy
from dit_trainer.diffusion.schedule import NoiseSchedule
from dit_trainer.grpo.prompts import PromptSampler
from dit_trainer.grpo.reference import ReferencePolicy, build_reference
from dit_trainer.grpo.trainer import GRPOSettings, GRPOTrainer
from dit_trainer.prompts import load_prompts
from dit_trainer.rewards.build import build_reward


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


def updates_per_epoch(cfg: TrainConfig) -> int:
    """Optimizer updates in one GRPO step (an epoch): what the LR schedule counts in."""
    return cfg.grpo.passes * cfg.grpo.minibatches


def build_prompt_sampler(cfg: TrainConfig) -> PromptSampler:
    g = cfg.grpo
    return PromptSampler(len(load_prompts(g.prompts, g.prompt_file, "grpo.")), g.prompts_per_epoch, g.prompt_sampling)


def build_kl_reference(cfg: TrainConfig, dit: DiTAdapter, accelerator: Accelerator) -> ReferencePolicy | None:
    """The starting policy the KL penalty anchors to (None without ``grpo.beta``)."""
    return build_reference(dit, cfg.lora.enabled, accelerator.autocast) if cfg.grpo.beta > 0 else None


def build_policy(cfg: TrainConfig, schedule: NoiseSchedule, device: torch.device) -> StochasticPolicy:
    """The schedule family's stochastic sampler over ``grpo.sample_steps``, noise only in the configured window and
    never in the last step (its noise would stay in the image; DDIM's has no variance when K divides T)."""
    g = cfg.grpo
    window = torch.zeros(g.sample_steps, dtype=torch.bool)
    window[g.sde_start : g.sample_steps - 1 if g.sde_steps is None else g.sde_start + g.sde_steps] = True
    return schedule.policy(g.sample_steps, device, g.noise_level, window.to(device))


def build_grpo_trainer(
    cfg: TrainConfig,
    loop: dict,
    parts: Components,
    frozen_dtype: torch.dtype,
    reference: ReferencePolicy | None,
    prompt_sampler: PromptSampler,
) -> GRPOTrainer:
    """The GRPO trainer on the loop's parts (``loop``: the ``Trainer`` arguments every run shares)."""
    device = loop["accelerator"].device
    return GRPOTrainer(
        **loop,
        grpo=grpo_settings(cfg),
        policy=build_policy(cfg, parts.schedule, device),
        vae=parts.vae,
        text_encoder=parts.text_encoder,
        reward=build_reward(cfg.reward, device, frozen_dtype),
        latent_shape=parts.latent_shape,
        prompt_sampler=prompt_sampler,
        reference=reference,
    )
