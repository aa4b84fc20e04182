"""Every model of a run built from its config: what training, sampling, verification and benchmarks share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.components.dit import DiTAdapter, build_dit, enable_gradient_checkpointing
from dit_trainer.components.fused_qkv import apply_fused_qkv
from dit_trainer.components.geometry import check_resolution
from dit_trainer.components.kinds import Conditioner
from dit_trainer.components.lora import apply_lora
from dit_trainer.components.vae import build_vae
from dit_trainer.config import (
    ConditionerConfig,
    DataConfig,
    DiffusionConfig,
    LoRAConfig,
    ModelConfig,
    PrivacyConfig,
    TrainerConfig,
    VAEConfig,
)
from dit_trainer.diffusion.build import build_noise_schedule
from dit_trainer.diffusion.schedule import NoiseSchedule


@dataclass
class Components:
    """The built models and schedule of a run: what a training step and a sampler need."""

    vae: torch.nn.Module
    text_encoder: Conditioner
    dit: DiTAdapter
    schedule: NoiseSchedule
    latent_shape: tuple[int, ...]  # (C, H, W), or a clip's (C, F, H, W)


def trained_start(model: ModelConfig, trainer: TrainerConfig) -> Path | None:
    """The weights a run started from another begins with (``model.pretrained``: a checkpoint's weights folder, or
    the run's own copy of it): weights dit-trainer wrote, read like every checkpoint from safetensors only (a pickle
    there was put there by someone else, and is not unpickled). None for a run not started so."""
    return Path(str(model.pretrained)) if trainer.init_weights else None


def build_components(
    *,
    model: ModelConfig,
    vae: VAEConfig,
    conditioner: ConditionerConfig,
    data: DataConfig,
    diffusion: DiffusionConfig,
    lora: LoRAConfig,
    privacy: PrivacyConfig,
    trainer: TrainerConfig,
    device: torch.device,
    frozen_dtype: torch.dtype,
    cached_text: Conditioner | None = None,
    dit_weights: Path | None = None,
) -> Components:
    """Frozen VAE and text encoder on ``device`` in ``frozen_dtype``; the DiT (float32 master weights) sized by
    the VAE's latent channels, the resolution, and the text encoder's hidden size, or loaded from ``dit_weights``
    (a checkpoint's whole transformer; by default ``trained_start``). Training from a cache passes
    its ``cached_text`` embeddings: the text encoder is then not loaded and the VAE keeps only its decoder. The
    sections come by name: ``call_with_sections(build_components, cfg, device=..., frozen_dtype=...)``."""
    autoencoder = build_vae(vae, device, frozen_dtype)
    check_resolution(model, data, autoencoder.downsample_factor)
    if cached_text is not None:
        autoencoder.drop_encoder()
    text_encoder = cached_text or build_text_encoder(conditioner, device, frozen_dtype)
    latent_size = data.resolution // autoencoder.downsample_factor
    dit_weights = dit_weights or trained_start(model, trainer)
    dit = build_dit(model, autoencoder.latent_channels, latent_size, text_encoder.size, dit_weights)
    if lora.enabled:
        apply_lora(dit.transformer, lora, dit.family.lora_targets)
    dit.freeze_dead_ends()  # after LoRA: an adapter there would wait for a gradient too
    if privacy.enabled and dit.family.prepare_private is not None:
        dit.family.prepare_private(dit.transformer)  # before the optimizer and EMA collect the parameters
    apply_fused_qkv(model, trainer, dit)  # before the memory estimate's meta copy and GRPO's reference copy
    if trainer.gradient_checkpointing:
        enable_gradient_checkpointing(dit, trainer.reentrant_checkpointing, trainer.gradient_checkpointing_every)
    schedule = build_noise_schedule(diffusion)
    return Components(autoencoder, text_encoder, dit, schedule, latent_shape(data.frames, autoencoder, latent_size))


def latent_shape(frames: int, vae: torch.nn.Module, latent_size: int) -> tuple[int, ...]:
    """(C, H, W) of an image's latents, or of a clip of ``frames``: (C, F', H, W), a temporal VAE giving the first
    frame's latent frame and one per group of ``vae.temporal_factor`` frames after it."""
    spatial = (latent_size, latent_size)
    if frames == 1:
        return (vae.latent_channels, *spatial)
    return (vae.latent_channels, (frames - 1) // vae.temporal_factor + 1, *spatial)
