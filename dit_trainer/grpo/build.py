"""A GRPO run's parts from its config: the epoch settings, the stochastic policy, the window of trained steps
and where it sits each epoch, the reference policy of the KL penalty, and the ``GRPOStep`` the training loop runs."""

from __future__ import annotations

import torch
from accelerate import Accelerator

from dit_trainer.components.build import Components
from dit_trainer.components.dit import DiTAdapter
from dit_trainer.config import DiffusionConfig, GRPOConfig, LoRAConfig, RewardConfig
from dit_trainer.diffusion.policy import FlowCPSPolicy, FlowSDEPolicy, StochasticPolicy
from dit_trainer.diffusion.schedule import NoiseSchedule
from dit_trainer.errors import ConfigError
from dit_trainer.grpo.step import GRPOSettings, GRPOStep
from dit_trainer.grpo.window import SDEWindow, window_plan
from dit_trainer.online.build import build_feedback
from dit_trainer.online.reference import ReferencePolicy, build_reference
from dit_trainer.prompts import load_prompts
from dit_trainer.sharding import is_sharded
from dit_trainer.training.step import StepParts


def grpo_settings(diffusion: DiffusionConfig, grpo: GRPOConfig) -> GRPOSettings:
    g = grpo
    return GRPOSettings(
        prompts=load_prompts(g.prompts, g.prompt_file, "grpo."),
        prompts_per_epoch=g.prompts_per_epoch,
        group_size=g.group_size,
        guidance_scale=diffusion.guidance_scale if g.guidance_scale is None else g.guidance_scale,
        clip_range=g.clip_range,
        filter_zero_std=g.filter_zero_std,
        beta=g.beta,
        minibatches=g.minibatches,
        passes=g.passes,
        rollout_batch_size=g.rollout_batch_size,
        steps_per_trajectory=g.steps_per_trajectory,
        train_unconditional=g.train_unconditional,
        shared_prefix=g.shared_prefix,
        tail_steps=g.tail_steps,
    )


def build_kl_reference(
    lora: LoRAConfig, grpo: GRPOConfig, dit: DiTAdapter, accelerator: Accelerator
) -> ReferencePolicy | None:
    """The starting policy the KL penalty anchors to (None without ``grpo.beta``)."""
    if grpo.beta == 0:
        return None
    if not lora.enabled and is_sharded(dit.parameters()):
        raise ConfigError(
            "grpo.beta",
            grpo.beta,
            "under FSDP the KL penalty of full fine-tuning would need a second, frozen copy of the sharded model, "
            "which this trainer does not build",
            "fine-tune with LoRA (`lora.enabled=true`: the reference is the same sharded model with its adapters "
            "off), set `grpo.beta=0`, or launch with DDP",
        )
    return build_reference(dit, lora.enabled, accelerator.autocast)


def build_policy(grpo: GRPOConfig, schedule: NoiseSchedule, device: torch.device) -> StochasticPolicy:
    """The schedule family's stochastic sampler over ``grpo.sample_steps`` (flow matching's ``grpo.sde_type``),
    noise only in the window's first position and never in the last step (its noise would stay in the image; DDIM's
    has no variance when K divides T). A moving window is placed anew at every epoch (``GRPOStep``)."""
    g = grpo
    plan = window_plan(g)
    policy = schedule.policy(g.sample_steps, device, g.noise_level, plan.mask(plan.start).to(device))
    if g.sde_type == "cps":  # the checks allow it for flow matching only, whose policy is the SDE's
        assert isinstance(policy, FlowSDEPolicy)
        return FlowCPSPolicy(policy.sigmas, policy.timesteps, policy.noise_level, policy.stochastic)
    return policy


def build_grpo_step(
    lora: LoRAConfig,
    diffusion: DiffusionConfig,
    reward: RewardConfig,
    grpo: GRPOConfig,
    loop: StepParts,
    parts: Components,
    frozen_dtype: torch.dtype,
) -> GRPOStep:
    """The GRPO step on the loop's parts (``loop``: what every method's step is given). Its KL anchor is the
    starting weights where accelerate put them (prepare moves the model to the GPU; a copy taken before would stay
    on the CPU), copied here, before anything trains and before a resume loads others."""
    device = loop.accelerator.device
    reference = build_kl_reference(lora, grpo, loop.accelerator.unwrap_model(loop.dit), loop.accelerator)
    return GRPOStep(
        loop,
        grpo=grpo_settings(diffusion, grpo),
        policy=build_policy(grpo, parts.schedule.at_size(parts.latent_shape), device),
        window=SDEWindow(window_plan(grpo)),
        text_encoder=parts.text_encoder,
        feedback=build_feedback(grpo, "grpo", reward, loop.accelerator, parts.vae, frozen_dtype),
        latent_shape=parts.latent_shape,
        reference=reference,
    )
