"""Text-to-latent sampling with classifier-free guidance, reproducible per image from its seed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dit_trainer.diffusion.schedule import NoiseSchedule


@dataclass(frozen=True)
class SamplerSettings:
    """How to sample: ``steps`` of the ``sampler`` (``ddim`` | ``dpmsolver++`` | ``euler`` for flow matching) with
    CFG at ``guidance_scale``.

    ``guidance_scale`` 1 is plain conditional sampling; above 1 mixes in the empty-prompt prediction (CFG).
    """

    steps: int
    guidance_scale: float
    sampler: str = "ddim"


@torch.no_grad()
def generate(
    dit: nn.Module,
    schedule: NoiseSchedule,
    text_encoder,
    prompts: Sequence[str],
    seeds: Sequence[int],
    latent_shape: tuple[int, int, int],
    settings: SamplerSettings,
    device: torch.device,
) -> torch.Tensor:
    """Latents (B, C, H, W) for ``prompts``; image ``i`` depends only on ``seeds[i]``, never on global RNG."""
    noise = [torch.randn(latent_shape, generator=torch.Generator("cpu").manual_seed(int(seed))) for seed in seeds]
    guidance_scale = settings.guidance_scale
    sampler = schedule.sampler(settings.steps, device, settings.sampler)
    latents = torch.stack(noise).to(device) * getattr(sampler, "init_noise_sigma", 1.0)  # flow samplers: none
    embeds, mask = text_encoder.encode(list(prompts))
    guided = guidance_scale != 1.0
    if guided:
        null_embeds, null_mask = text_encoder.encode([""] * len(prompts))
        embeds, mask = torch.cat([embeds, null_embeds]), torch.cat([mask, null_mask])
    for t in sampler.timesteps:
        model_input = sampler.scale_model_input(latents, t) if hasattr(sampler, "scale_model_input") else latents
        timestep = t.reshape(1).to(device)
        if guided:
            cond, uncond = dit(torch.cat([model_input, model_input]), timestep, embeds, mask).float().chunk(2)
            prediction = uncond + guidance_scale * (cond - uncond)
        else:
            prediction = dit(model_input, timestep, embeds, mask).float()
        latents = sampler.step(prediction, t, latents).prev_sample
    return latents


@dataclass
class TextToImage:
    """Prompts and seeds to images in [0, 1]: the frozen text encoder and VAE and the schedule around a DiT.

    The DiT is an argument, not a field, so one instance serves the raw and the EMA weights alike.
    """

    vae: nn.Module
    text_encoder: nn.Module
    schedule: NoiseSchedule
    latent_shape: tuple[int, int, int]
    device: torch.device

    @torch.no_grad()
    def __call__(
        self,
        dit: nn.Module,
        prompts: Sequence[str],
        seeds: Sequence[int],
        settings: SamplerSettings,
        batch_size: int = 32,
    ) -> torch.Tensor:
        """(len(prompts), 3, H, W) float32 images, ``batch_size`` at a time; each depends on its seed, not its batch."""
        images = []
        for start in range(0, len(prompts), batch_size):
            latents = generate(
                dit,
                self.schedule,
                self.text_encoder,
                prompts[start : start + batch_size],
                seeds[start : start + batch_size],
                self.latent_shape,
                settings,
                self.device,
            )
            images.append(((self.vae.decode(latents) + 1) / 2).float())
        return torch.cat(images)
