"""A DiffusionNFT run's step from its config: the epoch settings, the old policy, the reference of the KL term and
the shared rollout feedback."""

from __future__ import annotations

import torch

from dit_trainer.components.build import Components
from dit_trainer.components.freeze import trainable_parameters
from dit_trainer.config import DiffusionConfig, LoRAConfig, NFTConfig, RewardConfig
from dit_trainer.diffusion.sampler import SamplerSettings
from dit_trainer.errors import ConfigError
from dit_trainer.nft.old_policy import DecaySchedule, OldPolicy
from dit_trainer.nft.step import NFTSettings, NFTStep
from dit_trainer.online.build import build_feedback
from dit_trainer.online.reference import build_reference
from dit_trainer.prompts import load_prompts
from dit_trainer.sharding import is_sharded
from dit_trainer.training.step import StepParts


def nft_settings(diffusion: DiffusionConfig, nft: NFTConfig) -> NFTSettings:
    n, d = nft, diffusion
    guidance = d.guidance_scale if n.guidance_scale is None else n.guidance_scale
    return NFTSettings(
        prompts=load_prompts(n.prompts, n.prompt_file, "nft."),
        group_size=n.group_size,
        sampling=SamplerSettings(n.sample_steps, guidance, n.sampler or d.sampler),
        rollout_batch_size=n.rollout_batch_size,
        adv_clip_max=n.adv_clip_max,
        beta=n.beta,
        steps_per_sample=n.steps_per_sample or n.sample_steps - 1,
        kl_weight=n.kl_weight,
        minibatches=n.minibatches,
        passes=n.passes,
    )


def build_nft_step(
    lora: LoRAConfig,
    diffusion: DiffusionConfig,
    reward: RewardConfig,
    nft: NFTConfig,
    loop: StepParts,
    parts: Components,
    frozen_dtype: torch.dtype,
) -> NFTStep:
    """The NFT step on the loop's parts. The old policy and the reference start as the weights where accelerate put
    them, copied here, before anything trains and before a resume loads others."""
    n, accelerator = nft, loop.accelerator
    model = accelerator.unwrap_model(loop.dit)
    parameters = trainable_parameters(model.transformer)
    if is_sharded(parameters):
        raise ConfigError(
            "trainer.method",
            "nft",
            "under FSDP the old policy would need its own copy of every process's shards, which this trainer does "
            "not keep yet",
            "launch with DDP (`accelerate launch --multi_gpu`), where the old policy is a copy of the trained weights "
            "(of the adapters alone with `lora.enabled=true`)",
        )
    reference = build_reference(model, lora.enabled, accelerator.autocast) if n.kl_weight > 0 else None
    return NFTStep(
        loop,
        settings=nft_settings(diffusion, nft),
        schedule=parts.schedule.at_size(parts.latent_shape),
        text_encoder=parts.text_encoder,
        feedback=build_feedback(n, "nft", reward, accelerator, parts.vae, frozen_dtype),
        old_policy=OldPolicy(parameters, DecaySchedule(n.old_decay_flat, n.old_decay_rate, n.old_decay_max)),
        latent_shape=parts.latent_shape,
        reference=reference,
    )
