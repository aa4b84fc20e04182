"""The model-specific training step, in one function that GRPO, DP and LoRA variants reuse or wrap."""

from __future__ import annotations

import torch
from torch import nn

from dit_trainer.diffusion.loss import per_sample_mse
from dit_trainer.diffusion.schedule import NoiseSchedule


def drop_captions(captions: list[str], probability: float, generator: torch.Generator) -> list[str]:
    """Replace each caption by the empty prompt with ``probability``: the unconditional branch of CFG."""
    if probability == 0:
        return list(captions)
    keep = torch.rand(len(captions), generator=generator, device=generator.device) >= probability
    return [caption if kept else "" for caption, kept in zip(captions, keep.tolist())]


def diffusion_loss(
    batch: dict,
    dit: nn.Module,
    vae,
    text_encoder,
    schedule: NoiseSchedule,
    generator: torch.Generator,
    caption_dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode (frozen, no grad) -> noise -> predict -> per-sample loss. Returns (loss (B,), timesteps (B,)).

    All randomness comes from ``generator`` so a resumed run draws exactly what the uninterrupted one would.
    """
    device = generator.device
    with torch.no_grad():
        if "latent_mean" in batch:  # from the latent cache: the VAE encoder already ran once per image
            mean, std = batch["latent_mean"].to(device), batch["latent_std"].to(device)
            latents = vae.latents_from_posterior(mean, std, generator)
        else:
            latents = vae.encode(batch["image"].to(device, non_blocking=True), generator)
        embeds, mask = text_encoder.encode(drop_captions(batch["caption"], caption_dropout, generator))
    noise = torch.randn(latents.shape, generator=generator, device=latents.device, dtype=latents.dtype)
    timesteps = schedule.sample_timesteps(latents.shape[0], latents.device, generator)
    noisy = schedule.add_noise(latents, noise, timesteps)
    prediction = dit(noisy, timesteps, embeds, mask)
    return per_sample_mse(prediction, schedule.target(latents, noise, timesteps)), timesteps
