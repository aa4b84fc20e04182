"""The training loss of a diffusion model, per sample: encode (frozen, no grad) -> noise -> predict -> (B,) loss,
weighted as the schedule says (the DiT repository's ``diffusion.training_losses``).

Losses stay (B,) until the end: weighting, DP's per-sample clipping and per-timestep loss curves need them so.
``DiffusionLoss`` binds the math to a run's frozen components, the way torchtitan's ``Trainer`` takes a loss function:
the trainer, the preflight, DP, verification and benchmarks all call it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dit_trainer.condition import Batch, Condition
from dit_trainer.diffusion.schedule import NoiseSchedule
from dit_trainer.pixels import to_model_range

# Captions -> the captions to encode this step, its draws from the generator: the data's tag shuffling and dropout
# (``data.captions.TagAugmentation``), handed in by the composition root.
CaptionTransform = Callable[[list[str], torch.Generator], list[str]]


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


def batch_condition(
    batch: Batch, text_encoder, probability: float, generator: torch.Generator, tags: CaptionTransform | None = None
) -> Condition:
    """The condition of the batch's captions after dropout: encoded now (their tags shuffled and dropped first, with
    ``tags``) or read from the cache, then a dropped caption takes the condition of "". The choice stays on the
    generator's device and is applied with ``where``: no host-device sync per step, and the encoded and cached
    paths are one."""
    cached = Condition.from_stored(batch, "text_")
    if cached is None:
        captions = batch["caption"] if tags is None else tags(batch["caption"], generator)
        condition = text_encoder.encode(captions)
    else:
        condition = cached.to(generator.device, non_blocking=True)
    keep = kept_captions(condition.batch_size, probability, generator)
    return condition if keep is None else condition.where(keep, text_encoder.encode([""]))


def offset_noise(latents: torch.Tensor, noise_offset: float, generator: torch.Generator) -> torch.Tensor:
    """Standard normal noise of ``latents``' shape, plus ``noise_offset`` x one normal draw per image and channel,
    constant over the image (Guttenberg's offset noise, as diffusers' training examples add it). A DDPM schedule's
    last step still holds signal, and an image's longest wavelength, its per-channel mean, is the last to be noised
    away: trained on plain noise, a model keeps the mean its sampling starts from and makes no image much darker or
    lighter than average. ``noise_offset`` 0 draws exactly the plain noise."""
    noise = torch.randn(latents.shape, generator=generator, device=latents.device, dtype=latents.dtype)
    if not noise_offset:
        return noise
    per_channel = (*latents.shape[:2], *(1,) * (latents.dim() - 2))
    offset = torch.randn(per_channel, generator=generator, device=latents.device, dtype=latents.dtype)
    return noise + noise_offset * offset


def diffusion_loss(
    batch: Batch,
    dit: nn.Module,
    vae,
    text_encoder,
    schedule: NoiseSchedule,
    generator: torch.Generator,
    caption_dropout: float = 0.0,
    noise_offset: float = 0.0,
    tags: CaptionTransform | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode (frozen, no grad) -> noise -> predict -> per-sample loss, weighted as the schedule says (min-SNR,
    flow weighting). Returns (loss (B,), timesteps (B,)). ``noise_offset``: ``offset_noise``; ``tags``: the
    captions' tag shuffling and dropout (``data.captions``).

    All randomness comes from ``generator`` so a resumed run draws exactly what the uninterrupted one would.
    """
    device = generator.device
    with torch.no_grad():
        if "latent_mean" in batch:  # from the latent cache: the VAE encoder already ran once per image
            mean, std = batch["latent_mean"], batch.get("latent_std")  # no std: a deterministic autoencoder
            std = None if std is None else std.to(device, non_blocking=True).float()  # stored float16, say
            latents = vae.latents_from_posterior(mean.to(device, non_blocking=True).float(), std, generator)
        else:
            latents = vae.encode(to_model_range(batch["image"].to(device, non_blocking=True)), generator)
        condition = batch_condition(batch, text_encoder, caption_dropout, generator, tags)
    noise = offset_noise(latents, noise_offset, generator)
    timesteps = schedule.at_size(latents.shape).sample_timesteps(latents.shape[0], latents.device, generator)
    noisy = schedule.add_noise(latents, noise, timesteps)
    prediction = dit(noisy, timesteps, condition)
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
    noise_offset: float = 0.0  # diffusion.noise_offset
    tags: CaptionTransform | None = None  # data.shuffle_tags, data.tag_dropout (``data.captions.tag_augmentation``)

    def __call__(self, batch: Batch, dit: nn.Module, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return diffusion_loss(
            batch,
            dit,
            self.vae,
            self.text_encoder,
            self.schedule,
            generator,
            self.caption_dropout,
            self.noise_offset,
            self.tags,
        )
