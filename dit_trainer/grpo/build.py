"""A GRPO run's parts from its config: its own copy of the weights it starts from, the epoch settings, the
stochastic policy with its window of trained steps, the reference policy of the KL penalty, and the ``GRPOStep``
the training loop runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from accelerate import Accelerator

from dit_trainer.components.build import Components
from dit_trainer.components.dit import DiTAdapter
from dit_trainer.config import TrainConfig
from dit_trainer.diffusion.policy import StochasticPolicy
from dit_trainer.diffusion.schedule import NoiseSchedule
from dit_trainer.durable import link_or_copy_tree
from dit_trainer.errors import ConfigError
from dit_trainer.grpo.prompts import PromptSampler
from dit_trainer.grpo.reference import ReferencePolicy, build_reference
from dit_trainer.grpo.step import GRPOSettings, GRPOStep
from dit_trainer.prompts import load_prompts
from dit_trainer.rewards.build import build_reward
from dit_trainer.sharding import is_sharded
from dit_trainer.training.step import StepParts

OWN_WEIGHTS = "init"  # RUN/init/<weights folder>: the weights a GRPO run started from, its own copy


def own_starting_weights(cfg: TrainConfig, run_dir: Path, accelerator: Accelerator) -> TrainConfig:
    """``cfg`` with ``model.pretrained`` at the run's own copy of the weights it starts from (hard links where the
    file system allows): its samples, exports, resumes and KL anchor never depend on the init run's checkpoint, which
    that run may prune. The main process makes the copy; the others wait for it."""
    source = Path(str(cfg.model.pretrained))
    own = run_dir / OWN_WEIGHTS / source.name
    if source != own.resolve():
        if accelerator.is_main_process and not own.is_dir():
            own.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy_tree(source, own)
        accelerator.wait_for_everyone()
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pretrained=str(own.resolve())))


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
    return PromptSampler(load_prompts(g.prompts, g.prompt_file, "grpo."), g.prompts_per_epoch, g.prompt_sampling)


def build_kl_reference(cfg: TrainConfig, dit: DiTAdapter, accelerator: Accelerator) -> ReferencePolicy | None:
    """The starting policy the KL penalty anchors to (None without ``grpo.beta``)."""
    if cfg.grpo.beta == 0:
        return None
    if not cfg.lora.enabled and is_sharded(dit.parameters()):
        raise ConfigError(
            "grpo.beta",
            cfg.grpo.beta,
            "under FSDP the KL penalty of full fine-tuning would need a second, frozen copy of the sharded model, "
            "which this trainer does not build",
            "fine-tune with LoRA (`lora.enabled=true`: the reference is the same sharded model with its adapters "
            "off), set `grpo.beta=0`, or launch with DDP",
        )
    return build_reference(dit, cfg.lora.enabled, accelerator.autocast)


def build_policy(cfg: TrainConfig, schedule: NoiseSchedule, device: torch.device) -> StochasticPolicy:
    """The schedule family's stochastic sampler over ``grpo.sample_steps``, noise only in the configured window and
    never in the last step (its noise would stay in the image; DDIM's has no variance when K divides T)."""
    g = cfg.grpo
    window = torch.zeros(g.sample_steps, dtype=torch.bool)
    window[g.sde_start : g.sample_steps - 1 if g.sde_steps is None else g.sde_start + g.sde_steps] = True
    return schedule.policy(g.sample_steps, device, g.noise_level, window.to(device))


def build_grpo_step(
    cfg: TrainConfig,
    loop: StepParts,
    parts: Components,
    frozen_dtype: torch.dtype,
    reference: ReferencePolicy | None,
    prompt_sampler: PromptSampler,
) -> GRPOStep:
    """The GRPO step on the loop's parts (``loop``: what every method's step is given)."""
    device = loop.accelerator.device
    return GRPOStep(
        loop,
        grpo=grpo_settings(cfg),
        policy=build_policy(cfg, parts.schedule.at_size(parts.latent_shape), device),
        vae=parts.vae,
        text_encoder=parts.text_encoder,
        reward=build_reward(cfg.reward, device, frozen_dtype),
        latent_shape=parts.latent_shape,
        prompt_sampler=prompt_sampler,
        reference=reference,
    )
