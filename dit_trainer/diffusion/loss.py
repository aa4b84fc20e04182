"""The training loss of a diffusion model, per sample: encode (frozen, no grad) -> noise -> predict -> (B,) loss,
weighted as the schedule says (the DiT repository's ``diffusion.training_losses``).

Losses stay (B,) until the end: weighting, DP's per-sample clipping and per-timestep loss curves need them so.
``DiffusionLoss`` binds the math to a run's frozen components, the way torchtitan's ``Trainer`` takes a loss function:
the trainer, the preflight, DP, verification and benchmarks all call it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dit_trainer.diffusion.schedule import NoiseSchedule


def per_sample_mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over every dimension but the batch, in float32: shape (B,). ``mse_loss`` without
    reduction is one kernel forward and one backward (a subtraction and a power are two each)."""
    return F.mse_loss(prediction.float(), target.float(), reduction="none").flatten(1).mean(dim=1)


def kept_captions(count: int, probability: float, generator: torch.Generator) -> torch.Tensor | None:
    """Which of ``count`` captions to keep (None: all); each is dropped for the empty prompt with ``probability``,
    which trains the unconditional branch of CFG."""
    if probability == 0:
        return None
    return torch.rand(count, generator=generator, device=generator.device) >= probability


def drop_captions(captions: list[str], probability: float, generator: torch.Generator) -> list[str]:
    keep = kept_captions(len(captions), probability, generator)
    return list(captions) if keep is None else [c if kept else "" for c, kept in zip(captions, keep.tolist())]


def batch_condition(batch: dict, text_encoder, probability: float, generator: torch.Generator):
    """(embeds, mask) of the batch's captions after dropout: encoded now, or read from the cache (then a dropped
    caption takes the cached embedding of ""). Both draw the same random numbers, so the two paths agree."""
    if "text_embeds" not in batch:
        return text_encoder.encode(drop_captions(batch["caption"], probability, generator))
    device = generator.device
    embeds, mask = (batch[key].to(device, non_blocking=True) for key in ("text_embeds", "text_mask"))
    keep = kept_captions(len(embeds), probability, generator)
    if keep is None:
        return embeds, mask
    empty_embeds, empty_mask = text_encoder.encode([""])
    return torch.where(keep[:, None, None], embeds, empty_embeds), torch.where(keep[:, None], mask, empty_mask)


def diffusion_loss(
    batch: dict,
    dit: nn.Module,
    vae,
    text_encoder,
    schedule: NoiseSchedule,
    generator: torch.Generator,
    caption_dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode (frozen, no grad) -> noise -> predict -> per-sample loss, weighted as the schedule says (min-SNR,
    flow weighting). Returns (loss (B,), timesteps (B,)).

    All randomness comes from ``generator`` so a resumed run draws exactly what the uninterrupted one would.
    """
    device = generator.device
    with torch.no_grad():
        if "latent_mean" in batch:  # from the latent cache: the VAE encoder already ran once per image
            mean, std = (batch[key].to(device, non_blocking=True) for key in ("latent_mean", "latent_std"))
            latents = vae.latents_from_posterior(mean, std, generator)
        else:
            latents = vae.encode(batch["image"].to(device, non_blocking=True), generator)
        embeds, mask = batch_condition(batch, text_encoder, caption_dropout, generator)
    noise = torch.randn(latents.shape, generator=generator, device=latents.device, dtype=latents.dtype)
    timesteps = schedule.sample_timesteps(latents.shape[0], latents.device, generator)
    noisy = schedule.add_noise(latents, noise, timesteps)
    prediction = dit(noisy, timesteps, embeds, mask)
    loss = per_sample_mse(prediction, schedule.target(latents, noise, timesteps))
    weights = schedule.loss_weights(timesteps)
    return (loss if weights is None else loss * weights.to(loss)), timesteps


@dataclass
class DiffusionLoss:
    """Noise-prediction training of a DiT whose VAE and text encoder are frozen: ``loss_fn(batch, dit, generator)
    -> (loss (B,), timesteps (B,))``. The DiT is an argument so the preflight can pass the unwrapped model and
    monitors the EMA one."""

    vae: nn.Module
    text_encoder: nn.Module
    schedule: NoiseSchedule
    caption_dropout: float = 0.0

    def __call__(self, batch: dict, dit: nn.Module, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return diffusion_loss(batch, dit, self.vae, self.text_encoder, self.schedule, generator, self.caption_dropout)
