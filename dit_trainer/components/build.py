"""Every model of a run built from its config: what training, sampling, verification and benchmarks share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.components.dit import DiTAdapter, build_dit, enable_gradient_checkpointing, known_patch_size
from dit_trainer.components.families import FAMILIES
from dit_trainer.components.fused_qkv import apply_fused_qkv
from dit_trainer.components.kinds import Conditioner
from dit_trainer.components.lora import apply_lora
from dit_trainer.components.vae import build_vae, known_downsample_factor
from dit_trainer.config import TrainConfig
from dit_trainer.diffusion.build import build_noise_schedule
from dit_trainer.diffusion.schedule import NoiseSchedule
from dit_trainer.errors import ConfigError
from dit_trainer.hub import model_config


@dataclass
class Components:
    """The built models and schedule of a run: what a training step and a sampler need."""

    vae: torch.nn.Module
    text_encoder: Conditioner
    dit: DiTAdapter
    schedule: NoiseSchedule
    latent_shape: tuple[int, int, int]


def check_resolution(cfg: TrainConfig, downsample_factor: int) -> None:
    """Refuse a ``data.resolution`` that the VAE's downsampling and the DiT's patches do not divide: the VAE would
    round the latent size, silently dropping the images' edges. Checked with the config when the factor is known
    then, else as soon as the VAE has loaded."""
    patch, resolution = known_patch_size(cfg.model), cfg.data.resolution
    step = downsample_factor * (patch or 1)
    if resolution % step == 0:
        return
    lower = resolution // step * step
    nearest = f"`data.resolution={lower}` or `data.resolution={lower + step}`" if lower else f"`data.resolution={step}`"
    divisor = f"the VAE's downsampling factor {downsample_factor}"
    if patch:
        divisor = f"the VAE's downsampling factor × the DiT's patch size = {downsample_factor} × {patch} = {step}"
    raise ConfigError(
        "data.resolution",
        resolution,
        f"it must be a multiple of {divisor} (images become {downsample_factor}× smaller latents, cut into patches; "
        "another size would be rounded, silently dropping the images' edges)",
        f"set {nearest}",
    )


def pixel_multiple(cfg: TrainConfig, download: bool = False) -> int | None:
    """What every image side must be a multiple of for its latent to cut into whole patches: the VAE's downsampling
    factor x the DiT's patch size. Read from the models' config.json files where they are on this machine; else
    None, or with ``download`` those files are downloaded (not the weights)."""
    factor, patch = known_downsample_factor(cfg.vae, download), known_patch_size(cfg.model)
    if download and patch is None:
        config = model_config(cfg.model.pretrained, cfg.model.subfolder, cfg.model.revision, "model.pretrained")
        patch = config["patch_size"] * FAMILIES.get(cfg.model.family).packing
    return None if factor is None or patch is None else factor * patch


def trained_start(cfg: TrainConfig) -> Path | None:
    """The weights a run started from another begins with (``model.pretrained``: a checkpoint's weights folder, or
    the run's own copy of it): weights dit-trainer wrote, read like every checkpoint from safetensors only (a pickle
    there was put there by someone else, and is not unpickled). None for a run not started so."""
    return Path(str(cfg.model.pretrained)) if cfg.trainer.init_weights else None


def build_components(
    cfg: TrainConfig,
    device: torch.device,
    frozen_dtype: torch.dtype,
    cached_text: Conditioner | None = None,
    dit_weights: Path | None = None,
) -> Components:
    """Frozen VAE and text encoder on ``device`` in ``frozen_dtype``; the DiT (float32 master weights) sized by
    the VAE's latent channels, the resolution, and the text encoder's hidden size, or loaded from ``dit_weights``
    (a checkpoint's whole transformer; by default ``trained_start``). Training from a cache passes
    its ``cached_text`` embeddings: the text encoder is then not loaded and the VAE keeps only its decoder."""
    vae = build_vae(cfg.vae, device, frozen_dtype)
    check_resolution(cfg, vae.downsample_factor)
    if cached_text is not None:
        vae.drop_encoder()
    text_encoder = cached_text or build_text_encoder(cfg.text_encoder, device, frozen_dtype)
    latent_size = cfg.data.resolution // vae.downsample_factor
    dit_weights = dit_weights or trained_start(cfg)
    dit = build_dit(cfg.model, vae.latent_channels, latent_size, text_encoder.size, dit_weights)
    if cfg.lora.enabled:
        apply_lora(dit.transformer, cfg.lora, dit.family.lora_targets)
    if cfg.privacy.enabled and dit.family.prepare_private is not None:
        dit.family.prepare_private(dit.transformer)  # before the optimizer and EMA collect the parameters
    apply_fused_qkv(cfg, dit)  # before the memory estimate's meta copy and GRPO's reference copy
    if cfg.trainer.gradient_checkpointing:
        enable_gradient_checkpointing(
            dit, cfg.trainer.reentrant_checkpointing, cfg.trainer.gradient_checkpointing_every
        )
    schedule = build_noise_schedule(cfg.diffusion)
    return Components(vae, text_encoder, dit, schedule, (vae.latent_channels, latent_size, latent_size))
