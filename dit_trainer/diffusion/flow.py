"""The flow-matching family (rectified flow, as SD3, Flux and Sana): x_t = (1 - sigma) x0 + sigma eps, the DiT
predicts the velocity eps - x0, and Euler steps integrate it from sigma 1 to 0. Timesteps are sigma * T."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.training_utils import compute_loss_weighting_for_sd3

from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion.policy import FlowSDEPolicy
from dit_trainer.diffusion.schedule import NoiseSchedule, SchedulerStep, TimestepDensity
from dit_trainer.errors import require

DEFAULT_NOISE_LEVEL = 0.7  # Flow-GRPO's a
FLOW_SCHEDULER = "FlowMatchEulerDiscreteScheduler"  # diffusers' sampler of flow matching


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """SD3's resolution shift (diffusers' ``FlowMatchEulerDiscreteScheduler`` applies the same): more noise."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


class FallbackFlowScheduler:
    """Rectified flow without diffusers: sigma(t) = shift(t / T) and a plain Euler sampler from sigma 1 to 0."""

    init_noise_sigma = 1.0

    def __init__(self, num_train_timesteps: int = 1000, shift: float = 1.0) -> None:
        self.num_train_timesteps = num_train_timesteps
        self.shift = shift

    def set_timesteps(self, num_inference_steps: int, device: torch.device | str | None = None) -> None:
        self.sigmas = shift_sigmas(torch.linspace(1, 0, num_inference_steps + 1, device=device), self.shift)
        self.timesteps = self.sigmas[:-1] * self.num_train_timesteps
        self._index = 0

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor | None = None) -> torch.Tensor:
        return sample

    def step(self, model_output: torch.Tensor, timestep: torch.Tensor, sample: torch.Tensor, **_) -> SchedulerStep:
        """One Euler step along the predicted velocity (eps - x0) to the next sigma."""
        sigma, sigma_next = self.sigmas[self._index], self.sigmas[self._index + 1]
        self._index += 1
        return SchedulerStep(sample + (sigma_next - sigma) * model_output)


@dataclass(frozen=True)
class ResolutionShift:
    """Flux's resolution-dependent shift (``diffusion.resolution_shift``): larger images need more noise to destroy
    their structure, so the shift grows with the image's tokens. mu is linear in the token count (``base_shift`` at
    ``base_seq_len`` tokens, ``max_shift`` at ``max_seq_len``), and sigma -> e^mu sigma / (1 + (e^mu - 1) sigma),
    FluxPipeline's ``calculate_shift`` and FlowMatchEulerDiscreteScheduler's exponential time shift. ``terminal``:
    the sampler's levels stretched to end there (Qwen-Image's ``shift_terminal``); training's are not stretched.

    With ``empirical_steps`` (``diffusion.resolution_shift_rule=flux2``) mu is FLUX.2's empirical one instead
    (``empirical_mu``): a function of the latent positions (FLUX.2's latents come patched: one token each) and of the
    step count, the sampler's when it samples, ``empirical_steps`` (``EMPIRICAL_TRAINING_STEPS``) when training
    draws timesteps."""

    base_shift: float = 0.5
    max_shift: float = 1.15
    base_seq_len: int = 256
    max_seq_len: int = 4096
    terminal: float | None = None
    empirical_steps: int | None = None

    def mu(self, latent_size: tuple[int, int], steps: int | None = None) -> float:
        """mu for (H, W) latents (sampled in ``steps``, for the empirical rule): tokens counted as FluxPipeline packs
        them, 2 x 2 latents a token."""
        if self.empirical_steps is not None:
            return empirical_mu(latent_size[0] * latent_size[1], steps or self.empirical_steps)
        tokens = (latent_size[0] // 2) * (latent_size[1] // 2)
        slope = (self.max_shift - self.base_shift) / (self.max_seq_len - self.base_seq_len)
        return tokens * slope + self.base_shift - slope * self.base_seq_len


# The step count training's empirical mu is taken at: Flux2KleinPipeline's default for base models (their
# sampling's), fixed so that the noise training draws does not follow the preview's step count.
EMPIRICAL_TRAINING_STEPS = 50


def empirical_mu(tokens: int, steps: int) -> float:
    """FLUX.2's mu (Flux2Pipeline's ``compute_empirical_mu``), fitted by Black Forest Labs: linear in the image's
    tokens at 10 and at 200 steps, and between those linear in the step count; above 4,300 tokens the 200-step line
    alone."""
    at_200 = 1.6927e-4 * tokens + 0.45666666
    if tokens > 4300:
        return float(at_200)
    at_10 = 8.73809524e-5 * tokens + 1.89833333
    slope = (at_200 - at_10) / 190.0
    return float(at_200 + slope * (steps - 200))


def euler_scheduler(num_train_timesteps: int, shift: float, resolution: ResolutionShift | None) -> SchedulerMixin:
    """Diffusers' Euler sampler of flow matching: a fixed ``shift``, or Flux's resolution shift (the scheduler
    config FLUX.1 ships: ``use_dynamic_shifting``, mu passed at ``set_timesteps``; Qwen-Image's adds its
    ``shift_terminal``)."""
    if resolution is None:
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=num_train_timesteps, shift=shift)
    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=num_train_timesteps,
        use_dynamic_shifting=True,
        base_shift=resolution.base_shift,
        max_shift=resolution.max_shift,
        base_image_seq_len=resolution.base_seq_len,
        max_image_seq_len=resolution.max_seq_len,
        shift_terminal=resolution.terminal,
    )


def _euler(schedule: FlowSchedule) -> SchedulerMixin:
    return euler_scheduler(schedule.num_train_timesteps, schedule.shift, schedule.resolution)


class FlowSchedule(NoiseSchedule):
    """Flow matching; the math is ours, the scheduler only samples (diffusers' Euler, or the fallback's).

    With a ``resolution`` shift the noise levels depend on the image size: ``at_size(latent_shape)`` gives the
    schedule for that size (``mu`` set, ``shift`` = e^mu), and only that one draws timesteps or samples.
    """

    samplers = {"euler": _euler}
    fallback_type = FallbackFlowScheduler

    def __init__(
        self,
        scheduler,
        density: TimestepDensity,
        shift: float = 1.0,
        weighting: str = "none",
        resolution: ResolutionShift | None = None,
    ) -> None:
        super().__init__(scheduler, "flow_matching", density)
        self.shift = shift
        self.weighting = weighting
        self.resolution = resolution
        self.mu: float | None = None  # set by at_size with a resolution shift: training's
        self.size: tuple[int, int] | None = None  # the latent (H, W) at_size set

    def at_size(self, latent_shape: tuple[int, ...]) -> FlowSchedule:
        """Itself, or with a resolution shift a copy for (..., H, W) latents whose shift is e^mu."""
        if self.resolution is None:
            return self
        sized = copy.copy(self)
        sized.size = tuple(latent_shape[-2:])
        sized.mu = self.resolution.mu(sized.size)
        sized.shift = math.exp(sized.mu)
        if self.is_fallback:
            sized.scheduler = FallbackFlowScheduler(self.num_train_timesteps, sized.shift)
        return sized

    def _require_size(self) -> None:
        if self.resolution is not None and self.mu is None:
            raise RuntimeError("a resolution-shifted flow schedule needs the image size: use schedule.at_size(shape)")

    def set_timesteps(self, sampler, num_steps: int, device: torch.device) -> None:
        """With a resolution shift, FluxPipeline's grid (sigmas 1 ... 1/N, shifted by mu), so that an exported
        FluxPipeline samples the same timesteps; the fallback's linspace(1, 0, N + 1) is that grid already."""
        if not getattr(getattr(sampler, "config", None), "use_dynamic_shifting", False):
            super().set_timesteps(sampler, num_steps, device)
            return
        self._require_size()
        mu = self.resolution.mu(self.size, num_steps)  # the empirical rule's depends on the step count
        sampler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu, device=device)

    @classmethod
    def check_config(cls, d: DiffusionConfig) -> None:
        require(
            d.snr_gamma is None,
            "diffusion.snr_gamma",
            d.snr_gamma,
            "min-SNR weighting is for epsilon / v_prediction; flow matching weights with `diffusion.flow_weighting`",
            "set `diffusion.snr_gamma=null` and e.g. `diffusion.flow_weighting=sigma_sqrt`",
        )
        require(
            d.noise_offset == 0,
            "diffusion.noise_offset",
            d.noise_offset,
            "offset noise makes up for a DDPM schedule that never fully noises an image's mean (its last step still "
            "holds signal); rectified flow's path ends at pure noise, and offset noise would train it from a noise "
            "that sampling, which starts from a standard normal, never draws",
            "set `diffusion.noise_offset=0` (it is for `diffusion.objective=epsilon` and `v_prediction`)",
        )
        if d.resolution_shift:
            require(
                d.shift == 1.0,
                "diffusion.shift",
                d.shift,
                "`diffusion.resolution_shift=true` shifts by e^mu, mu from the image size, instead of a fixed shift",
                "set `diffusion.shift=1` (or `diffusion.resolution_shift=false` to keep the fixed shift)",
            )
            require(
                d.base_image_seq_len < d.max_image_seq_len,
                "diffusion.max_image_seq_len",
                d.max_image_seq_len,
                f"it must be larger than diffusion.base_image_seq_len ({d.base_image_seq_len}): mu is interpolated "
                "between them",
                "set e.g. `diffusion.base_image_seq_len=256 diffusion.max_image_seq_len=4096` (Flux's)",
            )
        require(
            d.resolution_shift_rule == "linear" or (d.resolution_shift and d.scheduler is not None),
            "diffusion.resolution_shift_rule",
            d.resolution_shift_rule,
            "FLUX.2's empirical mu depends on the sampler's step count, which diffusers' Euler scheduler takes on the "
            "resolution-shifted grid and a fixed shift or the built-in Euler does not",
            f"set `diffusion.resolution_shift=true` with `diffusion.scheduler={FLOW_SCHEDULER}`, or "
            "`diffusion.resolution_shift_rule=linear`",
        )
        require(
            d.shift_terminal is None or (d.resolution_shift and d.scheduler is not None),
            "diffusion.shift_terminal",
            d.shift_terminal,
            "the last noise level is stretched by diffusers' Euler scheduler on the resolution-shifted grid "
            "(Qwen-Image's scheduler), which a fixed shift or the built-in Euler does not use",
            f"set `diffusion.resolution_shift=true` with `diffusion.scheduler={FLOW_SCHEDULER}`, or "
            "`diffusion.shift_terminal=null`",
        )
        require(
            d.scheduler in (None, FLOW_SCHEDULER),
            "diffusion.scheduler",
            d.scheduler,
            f"flow matching uses `{FLOW_SCHEDULER}` (or null for the built-in Euler)",
            f"set `diffusion.scheduler={FLOW_SCHEDULER}` (configs/diffusion/flow.yaml does)",
        )

    @classmethod
    def from_config(cls, cfg: DiffusionConfig, density: TimestepDensity) -> FlowSchedule:
        """Diffusers' Euler scheduler samples when ``diffusion.scheduler`` is set, else the built-in Euler."""
        resolution = None
        if cfg.resolution_shift:
            empirical = EMPIRICAL_TRAINING_STEPS if cfg.resolution_shift_rule == "flux2" else None
            resolution = ResolutionShift(
                cfg.base_shift,
                cfg.max_shift,
                cfg.base_image_seq_len,
                cfg.max_image_seq_len,
                cfg.shift_terminal,
                empirical,
            )
        if cfg.scheduler is None:
            scheduler = FallbackFlowScheduler(cfg.num_train_timesteps, cfg.shift)
        else:
            scheduler = euler_scheduler(cfg.num_train_timesteps, cfg.shift, resolution)
        return cls(scheduler, density, cfg.shift, cfg.flow_weighting, resolution)

    def sample_timesteps(self, batch_size: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        """Floats sigma * T in (0, T], sigma shifted by ``shift``."""
        return self.timesteps_at(self.density(batch_size, device, generator))

    def timesteps_at(self, u: torch.Tensor) -> torch.Tensor:
        self._require_size()
        return (shift_sigmas(u, self.shift) * self.num_train_timesteps).float()

    def sigmas(self, timesteps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The noise level sigma = t / T, shaped to broadcast against ``like``."""
        return (timesteps.float() / self.num_train_timesteps).view(-1, *([1] * (like.ndim - 1))).to(like.dtype)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        sigma = self.sigmas(timesteps, x0)
        return (1 - sigma) * x0 + sigma * noise

    def target(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        return noise - x0

    def predicted_x0(self, prediction: torch.Tensor, sample: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """x0 = x_sigma - sigma v."""
        return sample - self.sigmas(timesteps, sample) * prediction

    def loss_weights(self, timesteps: torch.Tensor) -> torch.Tensor | None:
        """``sigma_sqrt`` / ``cosmap`` (diffusers' SD3 weighting), or None."""
        if self.weighting == "none":
            return None
        return compute_loss_weighting_for_sd3(self.weighting, timesteps.float() / self.num_train_timesteps)

    def policy(
        self, num_steps: int, device: torch.device, noise_level: float | None, stochastic: torch.Tensor | None = None
    ) -> FlowSDEPolicy:
        """Flow-GRPO's SDE over the Euler sampler's sigmas (``noise_level`` a, default 0.7)."""
        sampler = self.sampler(num_steps, device)
        every = torch.ones(num_steps, dtype=torch.bool, device=device) if stochastic is None else stochastic
        level = DEFAULT_NOISE_LEVEL if noise_level is None else noise_level
        return FlowSDEPolicy(sampler.sigmas.to(device), sampler.timesteps, level, every.to(device))
