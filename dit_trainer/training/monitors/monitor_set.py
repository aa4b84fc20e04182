"""The monitors of a run, from its config: the sample grid, the reward monitor, the validation loss and FID.
Each runs under no_grad on the EMA weights, on the main process; what only the main process needs (reward models,
held-out latents, reference features) is built there alone."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate.logging import get_logger
from torch.utils.data import Dataset

from dit_trainer.components.build import Components
from dit_trainer.config import (
    DataConfig,
    DiffusionConfig,
    MonitorConfig,
    RewardConfig,
    TrainerConfig,
    VAEConfig,
    ValidationConfig,
)
from dit_trainer.diffusion.sampler import SamplerSettings
from dit_trainer.errors import ConfigError
from dit_trainer.rewards.build import build_reward
from dit_trainer.rewards.fid import (
    build_feature_extractor,
    check_reference_size,
    reference_cache_dir,
    sample_count,
    small_sample_warning,
    validation_reference,
)
from dit_trainer.training.monitors.fid_monitor import FIDMonitor
from dit_trainer.training.monitors.monitors import (
    GRPORewardMonitor,
    Monitor,
    MonitorContext,
    SampleGridMonitor,
    SamplingPlan,
)
from dit_trainer.training.monitors.validation import ValidationMonitor, encode_held_out

logger = get_logger(__name__)
SAMPLE_SEEDS_PER_PROMPT = 4


def build_monitors(
    diffusion: DiffusionConfig,
    trainer: TrainerConfig,
    reward: RewardConfig,
    monitor: MonitorConfig,
    context: MonitorContext,
    run_dir: Path,
    frozen_dtype: torch.dtype,
    reward_prompts: Sequence[str],
) -> list[Monitor]:
    """The sample grid, and the reward monitor on ``reward_prompts`` when ``monitor.reward.enabled``. Reward models
    are loaded on the main process only: the others never score."""
    d, t, grpo = diffusion, trainer, monitor.reward
    grid_plan = SamplingPlan(
        list(t.sample_prompts),
        SAMPLE_SEEDS_PER_PROMPT,
        t.sample_seed,
        SamplerSettings(d.sample_steps, d.guidance_scale, d.sampler),
    )
    monitors: list[Monitor] = [SampleGridMonitor(context, grid_plan, run_dir / "samples", t.sample_every)]
    if grpo.enabled:
        accelerator = context.accelerator
        scorer = build_reward(reward, accelerator.device, frozen_dtype) if accelerator.is_main_process else None
        plan = SamplingPlan(
            list(reward_prompts),
            grpo.group_size,
            grpo.seed,
            SamplerSettings(
                grpo.sample_steps or d.sample_steps,
                d.guidance_scale if grpo.guidance_scale is None else grpo.guidance_scale,
                d.sampler,
            ),
            grpo.batch_size,
        )
        monitors.append(GRPORewardMonitor(context, plan, run_dir / "rewards", grpo.every_n_steps, scorer, grpo.eps))
    return monitors


def build_validation_monitor(
    validation: ValidationConfig, context: MonitorContext, parts: Components, held_out: Dataset
) -> ValidationMonitor:
    """The validation loss on ``held_out``, encoded once on the main process (the others never validate; under FSDP
    they take part in each forward, so they encode it too)."""
    v, accelerator = validation, context.accelerator
    batches = None
    if accelerator.is_main_process or context.sharded:
        batches = encode_held_out(held_out, parts.vae, accelerator.device, v.batch_size)
        images = sum(len(batch["caption"]) for batch in batches)
        logger.info(f"validation: {images} held-out images x {v.timesteps} timesteps every {v.every_n_steps} steps")
    schedule = parts.schedule.at_size(parts.latent_shape)  # the run's image size (a bucket's may differ)
    return ValidationMonitor(context, v.every_n_steps, batches, parts.text_encoder, schedule, v.timesteps, v.seed)


def build_fid_monitor(
    vae: VAEConfig,
    data: DataConfig,
    diffusion: DiffusionConfig,
    monitor: MonitorConfig,
    validation: ValidationConfig,
    context: MonitorContext,
    parts: Components,
    run_dir: Path,
) -> FIDMonitor:
    """FID against the validation images, whose features are computed (or read from their cache: by default in
    ``run_dir``) on the main process only."""
    f, d, v, accelerator = monitor.fid, diffusion, validation, context.accelerator
    if context.sharded:
        raise ConfigError(
            "monitor.fid.enabled",
            True,
            "the FID monitor samples on the main process only, and under FSDP a forward needs every process",
            "turn it off for sharded runs (`monitor.fid.enabled=false`) and compute FID afterwards with "
            "`scripts/evaluate.py` on the exported weights",
        )
    extractor = reference = None
    if accelerator.is_main_process:
        extractor = build_feature_extractor(f.features, f.weights, parts.vae, vae, accelerator.device)
        cache_dir = reference_cache_dir(f.cache_dir, data, run_dir)
        reference = validation_reference(data, validation, extractor, cache_dir, accelerator.device, f.batch_size)
        key, value = ("validation.path", v.path) if v.path else ("validation.split", v.split)
        more = "add images to `validation.path`" if v.path else "hold out more images (a larger `validation.split`)"
        check_reference_size(
            reference, key, value, f"{more}, or turn the FID monitor off (`monitor.fid.enabled=false`)"
        )
        samples = sample_count(reference, f.num_images)
        logger.info(
            f"FID every {f.every_n_steps} steps: {samples} samples against {len(reference.captions)} validation "
            f"images, {f.features} features",
            main_process_only=True,
        )
        warning = small_sample_warning(samples, reference)
        if warning:
            logger.warning(warning, main_process_only=True)
    settings = SamplerSettings(d.sample_steps, d.guidance_scale, d.sampler)
    return FIDMonitor(context, f.every_n_steps, extractor, reference, settings, f.num_images, f.seed, f.batch_size)


def build_monitor_set(
    vae: VAEConfig,
    data: DataConfig,
    diffusion: DiffusionConfig,
    trainer: TrainerConfig,
    reward: RewardConfig,
    monitor: MonitorConfig,
    validation: ValidationConfig,
    context: MonitorContext,
    run_dir: Path,
    frozen_dtype: torch.dtype,
    parts: Components,
    held_out: Dataset | None,
    reward_prompts: Sequence[str],
) -> list[Monitor]:
    """A run's monitors in the order they run: the validation loss (when images are held out), the sample grid,
    the reward monitor (on ``reward_prompts``: ``reward_monitor_prompts``), FID."""
    monitors = build_monitors(diffusion, trainer, reward, monitor, context, run_dir, frozen_dtype, reward_prompts)
    if held_out is not None:
        monitors.insert(0, build_validation_monitor(validation, context, parts, held_out))
    if monitor.fid.enabled:
        monitors.append(build_fid_monitor(vae, data, diffusion, monitor, validation, context, parts, run_dir))
    return monitors
