"""Text-to-latent sampling with classifier-free guidance, reproducible per image from its seed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dit_trainer.condition import Condition
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


def text_condition(text_encoder, prompts: Sequence[str], guidance_scale: float) -> Condition:
    """The condition of ``prompts``, followed by as many empty-prompt rows when CFG is on (``guidance_scale`` != 1):
    the layout ``guided_prediction`` takes."""
    condition = text_encoder.encode(list(prompts))
    if guidance_scale == 1.0:
        return condition
    return Condition.cat([condition, text_encoder.encode([""]).expand(len(prompts))])


def guided_prediction(
    dit: nn.Module,
    sample: torch.Tensor,
    timestep: torch.Tensor,
    condition: Condition,
    guidance_scale: float,
    detach_unconditional: bool = False,
) -> torch.Tensor:
    """The DiT's float32 prediction at ``timestep`` (one, or one per row) with classifier-free guidance: the one CFG
    formula that sampling, GRPO's rollouts and its updates share (a different one would change the policy).
    ``detach_unconditional`` passes no gradient through the empty-prompt half (same value)."""
    if guidance_scale == 1.0:
        return dit(sample, timestep, condition).float()
    timestep = timestep.expand(sample.shape[0])
    doubled = dit(torch.cat([sample, sample]), torch.cat([timestep, timestep]), condition).float()
    cond, uncond = doubled.chunk(2)
    if detach_unconditional:
        uncond = uncond.detach()
    return guide(dit, cond, uncond, guidance_scale)


def guide(dit: nn.Module, cond: torch.Tensor, uncond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
    """CFG's combination of the conditional and the empty-prompt predictions: ``uncond + s (cond - uncond)``, or the
    DiT's own rule where its family's pipeline has one (``DiTAdapter.guide``; Qwen-Image rescales each token), so that
    an exported pipeline samples what we do. DDP's wrapper is looked through; a module without a rule combines as
    usual."""
    rule = getattr(getattr(dit, "module", dit), "guide", None)
    return uncond + guidance_scale * (cond - uncond) if rule is None else rule(cond, uncond, guidance_scale)


def initial_noise(seeds: Sequence[int], latent_shape: tuple[int, ...]) -> torch.Tensor:
    """(B, C, H, W) on the CPU: image ``i``'s noise depends only on ``seeds[i]``, never on global RNG."""
    return torch.stack([torch.randn(latent_shape, generator=torch.Generator("cpu").manual_seed(int(s))) for s in seeds])


@torch.no_grad()
def generate(
    dit: nn.Module,
    schedule: NoiseSchedule,
    text_encoder,
    prompts: Sequence[str],
    seeds: Sequence[int],
    latent_shape: tuple[int, ...],
    settings: SamplerSettings,
    device: torch.device,
) -> torch.Tensor:
    """Latents (B, C, H, W) for ``prompts``; image ``i`` depends only on ``seeds[i]``, never on global RNG."""
    sampler = schedule.at_size(latent_shape).sampler(settings.steps, device, settings.sampler)
    latents = initial_noise(seeds, latent_shape).to(device) * getattr(sampler, "init_noise_sigma", 1.0)
    condition = text_condition(text_encoder, prompts, settings.guidance_scale)
    for t in sampler.timesteps:
        model_input = sampler.scale_model_input(latents, t) if hasattr(sampler, "scale_model_input") else latents
        prediction = guided_prediction(dit, model_input, t.reshape(1).to(device), condition, settings.guidance_scale)
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
    latent_shape: tuple[int, ...]  # (C, H, W), or a clip's (C, F, H, W)
    device: torch.device

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) in pixels of the images (or clips) it generates."""
        factor = self.vae.downsample_factor
        return self.latent_shape[-2] * factor, self.latent_shape[-1] * factor

    @torch.no_grad()
    def __call__(
        self,
        dit: nn.Module,
        prompts: Sequence[str],
        seeds: Sequence[int],
        settings: SamplerSettings,
        batch_size: int = 32,
    ) -> torch.Tensor:
        """(len(prompts), 3, H, W) float32 images (clips: (len(prompts), 3, F, H, W)), ``batch_size`` at a time; each
        depends on its seed, not its batch."""
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
