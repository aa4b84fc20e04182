"""Text-to-latent sampling with classifier-free guidance, reproducible per image from its seed."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dit_trainer.diffusion.schedule import NoiseSchedule


@torch.no_grad()
def generate(
    dit: nn.Module,
    schedule: NoiseSchedule,
    text_encoder,
    prompts: Sequence[str],
    seeds: Sequence[int],
    latent_shape: tuple[int, int, int],
    num_steps: int,
    guidance_scale: float,
    device: torch.device,
) -> torch.Tensor:
    """Latents (B, C, H, W) for ``prompts``; image ``i`` depends only on ``seeds[i]``, never on global RNG.

    ``guidance_scale`` 1 is plain conditional sampling; above 1 mixes in the empty-prompt prediction (CFG).
    """
    noise = [torch.randn(latent_shape, generator=torch.Generator("cpu").manual_seed(int(seed))) for seed in seeds]
    sampler = schedule.sampler(num_steps, device)
    latents = torch.stack(noise).to(device) * sampler.init_noise_sigma
    embeds, mask = text_encoder.encode(list(prompts))
    guided = guidance_scale != 1.0
    if guided:
        null_embeds, null_mask = text_encoder.encode([""] * len(prompts))
        embeds, mask = torch.cat([embeds, null_embeds]), torch.cat([mask, null_mask])
    for t in sampler.timesteps:
        model_input = sampler.scale_model_input(latents, t)
        timestep = t.reshape(1).to(device)
        if guided:
            cond, uncond = dit(torch.cat([model_input, model_input]), timestep, embeds, mask).float().chunk(2)
            prediction = uncond + guidance_scale * (cond - uncond)
        else:
            prediction = dit(model_input, timestep, embeds, mask).float()
        latents = sampler.step(prediction, t, latents).prev_sample
    return latents
