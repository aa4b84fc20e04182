"""The noise schedule that training and sampling share.

``NoiseSchedule`` owns the forward process (``add_noise``), the regression target of each objective, and
builds the sampler for the reverse process from the same ``alphas_cumprod``, so the two cannot disagree.
A diffusers scheduler provides the schedule when one is configured; otherwise ``FallbackScheduler`` does, with
the same interface, and a warning says why.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import diffusers
import torch
from diffusers import DDIMScheduler, DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.training_utils import (
    compute_density_for_timestep_sampling,
    compute_loss_weighting_for_sd3,
    compute_snr,
)

from dit_trainer.config import FALLBACK_BETA_SCHEDULES, SAMPLERS, ConfigError, DiffusionConfig


def _betas(schedule: str, num_timesteps: int, beta_start: float, beta_end: float) -> torch.Tensor:
    if schedule == "linear":
        return torch.linspace(beta_start, beta_end, num_timesteps, dtype=torch.float64)
    if schedule == "scaled_linear":
        return torch.linspace(beta_start**0.5, beta_end**0.5, num_timesteps, dtype=torch.float64) ** 2
    if schedule == "squaredcos_cap_v2":  # improved DDPM's cosine alpha-bar
        steps = torch.arange(num_timesteps + 1, dtype=torch.float64) / num_timesteps
        alpha_bar = torch.cos((steps + 0.008) / 1.008 * math.pi / 2) ** 2
        return (1 - alpha_bar[1:] / alpha_bar[:-1]).clamp(max=0.999)
    raise ConfigError("diffusion.beta_schedule", schedule, f"the fallback schedule supports {FALLBACK_BETA_SCHEDULES}")


@dataclass
class SchedulerStep:
    prev_sample: torch.Tensor


class FallbackScheduler:
    """A self-contained DDPM forward process with a deterministic DDIM sampler (eta = 0, trailing timesteps).

    It mirrors the part of the diffusers scheduler interface we use (``add_noise``, ``get_velocity``,
    ``set_timesteps``, ``scale_model_input``, ``step``), so training and sampling code have a single path.
    """

    init_noise_sigma = 1.0

    def __init__(
        self,
        num_train_timesteps: int = 1000,
        beta_schedule: str = "linear",
        beta_start: float = 1e-4,
        beta_end: float = 0.02,
        prediction_type: str = "epsilon",
    ) -> None:
        self.num_train_timesteps = num_train_timesteps
        self.prediction_type = prediction_type
        betas = _betas(beta_schedule, num_train_timesteps, beta_start, beta_end)
        self.betas = betas.float()
        self.alphas_cumprod = torch.cumprod(1 - betas, dim=0).float()
        self.timesteps = torch.arange(num_train_timesteps - 1, -1, -1)

    def _coefficients(self, timesteps: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        alpha_bar = self.alphas_cumprod.to(like.device)[timesteps.long()].view(-1, *([1] * (like.ndim - 1)))
        return alpha_bar.sqrt().to(like.dtype), (1 - alpha_bar).sqrt().to(like.dtype)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        signal, sigma = self._coefficients(timesteps, x0)
        return signal * x0 + sigma * noise

    def get_velocity(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        signal, sigma = self._coefficients(timesteps, x0)
        return signal * noise - sigma * x0

    def set_timesteps(self, num_inference_steps: int, device: torch.device | str | None = None) -> None:
        stride = self.num_train_timesteps / num_inference_steps
        steps = torch.arange(self.num_train_timesteps, 0, -stride).round().long() - 1
        self.timesteps = steps.to(device)
        self._step_back = self.num_train_timesteps // num_inference_steps  # as diffusers' DDIM, so exports match

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor | int | None = None) -> torch.Tensor:
        return sample

    def step(
        self, model_output: torch.Tensor, timestep: torch.Tensor | int, sample: torch.Tensor, **_
    ) -> SchedulerStep:
        t = int(timestep)
        previous = t - self._step_back
        alpha_bar = self.alphas_cumprod[t].item()
        alpha_bar_prev = self.alphas_cumprod[previous].item() if previous >= 0 else 1.0
        if self.prediction_type == "epsilon":
            eps = model_output
            x0 = (sample - math.sqrt(1 - alpha_bar) * eps) / math.sqrt(alpha_bar)
        else:  # v_prediction
            x0 = math.sqrt(alpha_bar) * sample - math.sqrt(1 - alpha_bar) * model_output
            eps = math.sqrt(1 - alpha_bar) * sample + math.sqrt(alpha_bar) * model_output
        return SchedulerStep(math.sqrt(alpha_bar_prev) * x0 + math.sqrt(1 - alpha_bar_prev) * eps)


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


class NoiseSchedule:
    """Timestep sampling, ``x_t``, the objective's target, and a matching sampler, from one scheduler."""

    def __init__(self, scheduler, objective: str, cfg: DiffusionConfig | None = None) -> None:
        self.scheduler = scheduler
        self.objective = objective
        self.cfg = cfg or DiffusionConfig(objective=objective)
        self.is_flow = objective == "flow_matching"
        self.is_fallback = isinstance(scheduler, FallbackScheduler | FallbackFlowScheduler)

    @property
    def num_train_timesteps(self) -> int:
        if self.is_fallback:
            return self.scheduler.num_train_timesteps
        return self.scheduler.config.num_train_timesteps

    def sample_timesteps(self, batch_size: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        """Training timesteps from ``diffusion.timestep_sampling``: integers in [0, T) for DDPM objectives,
        floats sigma * T in (0, T] for flow matching (sigma shifted by ``diffusion.shift``)."""
        T, kind = self.num_train_timesteps, self.cfg.timestep_sampling
        if kind == "uniform" and not self.is_flow:
            return torch.randint(0, T, (batch_size,), generator=generator, device=device)
        u = timestep_density(kind, batch_size, self.cfg, device, generator)
        if self.is_flow:
            return shift_sigmas(u, self.cfg.shift) * T
        return (u * T).long().clamp(max=T - 1)

    def sigmas(self, timesteps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Flow matching's noise level sigma = t / T, shaped to broadcast against ``like``."""
        return (timesteps.float() / self.num_train_timesteps).view(-1, *([1] * (like.ndim - 1))).to(like.dtype)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        if self.is_flow:
            sigma = self.sigmas(timesteps, x0)
            return (1 - sigma) * x0 + sigma * noise
        return self.scheduler.add_noise(x0, noise, timesteps)

    def target(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        if self.objective == "epsilon":
            return noise
        if self.is_flow:
            return noise - x0
        return self.scheduler.get_velocity(x0, noise, timesteps)

    def loss_weights(self, timesteps: torch.Tensor) -> torch.Tensor | None:
        """Per-sample weights (B,) for the (B,) loss, or None: min-SNR-gamma for epsilon / v (Hang et al. 2023,
        with diffusers' ``compute_snr``), ``sigma_sqrt`` / ``cosmap`` for flow (diffusers' SD3 weighting)."""
        if self.is_flow:
            if self.cfg.flow_weighting == "none":
                return None
            sigmas = timesteps.float() / self.num_train_timesteps
            return compute_loss_weighting_for_sd3(self.cfg.flow_weighting, sigmas)
        if self.cfg.snr_gamma is None:
            return None
        snr = compute_snr(self.scheduler, timesteps)
        clipped = torch.minimum(snr, torch.full_like(snr, self.cfg.snr_gamma))
        return clipped / snr if self.objective == "epsilon" else clipped / (snr + 1)

    def sampler(self, num_steps: int, device: torch.device, kind: str = "ddim") -> SchedulerMixin | FallbackScheduler:
        """A fresh deterministic sampler of ``kind`` (``ddim`` | ``dpmsolver++``) over the same ``alphas_cumprod``,
        timesteps set. Without a diffusers scheduler, ``ddim`` is the fallback schedule's own sampler."""
        if self.is_fallback and kind in ("ddim", "euler"):
            sampler = type(self.scheduler).__new__(type(self.scheduler))
            sampler.__dict__.update(self.scheduler.__dict__)
        else:
            sampler = self.diffusers_sampler(kind)
        sampler.set_timesteps(num_steps, device=device)
        return sampler

    def diffusers_sampler(self, kind: str = "ddim") -> SchedulerMixin:
        """The diffusers scheduler that samples this schedule with ``kind``: what an exported pipeline ships.

        Trailing timestep spacing starts sampling at the last training timestep (pure noise), and ``clip_sample``
        is off because latents are not bounded to [-1, 1].
        """
        if self.is_flow:
            if kind != "euler":
                raise ConfigError("diffusion.sampler", kind, "flow matching samples with `euler`")
            return FlowMatchEulerDiscreteScheduler(num_train_timesteps=self.num_train_timesteps, shift=self.cfg.shift)
        if self.is_fallback:
            config = {"num_train_timesteps": self.num_train_timesteps, "trained_betas": self.scheduler.betas.tolist()}
        else:
            config = self.scheduler.config
        common = {"prediction_type": self.objective, "timestep_spacing": "trailing"}
        if kind == "ddim":
            return DDIMScheduler.from_config(config, clip_sample=False, set_alpha_to_one=True, **common)
        if kind == "dpmsolver++":
            return DPMSolverMultistepScheduler.from_config(
                config, algorithm_type="dpmsolver++", solver_order=2, final_sigmas_type="zero", **common
            )
        raise ConfigError("diffusion.sampler", kind, f"accepted values are {', '.join(SAMPLERS)}")


def _diffusers_scheduler(cfg: DiffusionConfig) -> SchedulerMixin:
    scheduler_class = getattr(diffusers, cfg.scheduler, None)
    if not (isinstance(scheduler_class, type) and issubclass(scheduler_class, SchedulerMixin)):
        raise ValueError(f"`{cfg.scheduler}` is not a scheduler class in diffusers {diffusers.__version__}")
    if cfg.scheduler_pretrained:
        config = scheduler_class.load_config(cfg.scheduler_pretrained, subfolder="scheduler")
    else:
        config = {
            "num_train_timesteps": cfg.num_train_timesteps,
            "beta_schedule": cfg.beta_schedule,
            "beta_start": cfg.beta_start,
            "beta_end": cfg.beta_end,
        }
    scheduler = scheduler_class.from_config(config, prediction_type=cfg.objective, clip_sample=False)
    if not hasattr(scheduler, "alphas_cumprod") or not hasattr(scheduler, "get_velocity"):
        raise ValueError(f"`{cfg.scheduler}` has no DDPM-style alphas_cumprod/get_velocity for {cfg.objective}")
    return scheduler


def timestep_density(kind: str, batch_size: int, cfg: DiffusionConfig, device, generator) -> torch.Tensor:
    """u in [0, 1] from SD3's densities: diffusers' ``compute_density_for_timestep_sampling`` (uniform,
    logit_normal, mode), and cosmap, which diffusers offers only as a loss weighting: u = 1 - 1 / (tan(pi/2 r) + 1)."""
    if kind == "cosmap":
        r = torch.rand(batch_size, device=device, generator=generator)
        return 1 - 1 / (torch.tan(math.pi / 2 * r) + 1)
    return compute_density_for_timestep_sampling(
        kind, batch_size, cfg.logit_mean, cfg.logit_std, cfg.mode_scale, device=device, generator=generator
    ).clamp(0, 1)


def build_noise_schedule(cfg: DiffusionConfig) -> NoiseSchedule:
    """The configured diffusers scheduler, or the fallback (with a warning naming why)."""
    reason = "no `diffusion.scheduler` is configured"
    if cfg.objective == "flow_matching":  # the math is ours; the scheduler only samples
        scheduler = FallbackFlowScheduler(cfg.num_train_timesteps, cfg.shift)
        if cfg.scheduler is not None:
            scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=cfg.num_train_timesteps, shift=cfg.shift)
        return NoiseSchedule(scheduler, cfg.objective, cfg)
    if cfg.scheduler is not None:
        try:
            return NoiseSchedule(_diffusers_scheduler(cfg), cfg.objective, cfg)
        except (OSError, ValueError) as error:
            reason = f"`diffusion.scheduler={cfg.scheduler}` could not be loaded ({error})"
    warnings.warn(
        f"{reason}; using the built-in fallback schedule ({cfg.beta_schedule} betas {cfg.beta_start}..{cfg.beta_end}, "
        f"{cfg.num_train_timesteps} steps, DDIM sampling).",
        stacklevel=2,
    )
    return NoiseSchedule(
        FallbackScheduler(cfg.num_train_timesteps, cfg.beta_schedule, cfg.beta_start, cfg.beta_end, cfg.objective),
        cfg.objective,
        cfg,
    )
