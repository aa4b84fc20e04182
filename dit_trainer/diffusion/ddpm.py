"""The DDPM family: x_t = sqrt(alpha_bar) x0 + sqrt(1 - alpha_bar) eps, trained to predict eps or v, sampled with
DDIM or DPM-Solver++ over the same ``alphas_cumprod``."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import diffusers
import torch
from diffusers import DDIMScheduler, DPMSolverMultistepScheduler
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.training_utils import compute_snr

from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion.flow import FLOW_SCHEDULER
from dit_trainer.diffusion.policy import DDIMPolicy
from dit_trainer.diffusion.schedule import NoiseSchedule, SchedulerStep, TimestepDensity
from dit_trainer.errors import require
from dit_trainer.registry import lookup

DEFAULT_ETA = 1.0  # DDPO's


def _linear(num_timesteps: int, beta_start: float, beta_end: float) -> torch.Tensor:
    return torch.linspace(beta_start, beta_end, num_timesteps, dtype=torch.float64)


def _scaled_linear(num_timesteps: int, beta_start: float, beta_end: float) -> torch.Tensor:
    return torch.linspace(beta_start**0.5, beta_end**0.5, num_timesteps, dtype=torch.float64) ** 2


def _squaredcos_cap_v2(num_timesteps: int, beta_start: float, beta_end: float) -> torch.Tensor:
    """Improved DDPM's cosine alpha-bar (the beta range is not used)."""
    steps = torch.arange(num_timesteps + 1, dtype=torch.float64) / num_timesteps
    alpha_bar = torch.cos((steps + 0.008) / 1.008 * math.pi / 2) ** 2
    return (1 - alpha_bar[1:] / alpha_bar[:-1]).clamp(max=0.999)


# The beta schedules the fallback computes itself (diffusers' schedulers have their own list).
BETA_SCHEDULES: dict[str, Callable[[int, float, float], torch.Tensor]] = {
    "linear": _linear,
    "scaled_linear": _scaled_linear,
    "squaredcos_cap_v2": _squaredcos_cap_v2,
}


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
        betas = lookup(BETA_SCHEDULES, "diffusion.beta_schedule", beta_schedule)(
            num_train_timesteps, beta_start, beta_end
        )
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


def _betas_config(schedule: DDPMSchedule) -> Mapping[str, Any]:
    """The schedule's betas as a diffusers scheduler config (the scheduler's own config when it has one)."""
    if schedule.is_fallback:
        return {"num_train_timesteps": schedule.num_train_timesteps, "trained_betas": schedule.scheduler.betas.tolist()}
    return schedule.scheduler.config


def _sampling_kwargs(schedule: DDPMSchedule) -> dict[str, str]:
    """Keyword arguments, not config entries: ``from_config`` drops config keys it marks as defaults (such as
    ``timestep_spacing``). Trailing spacing starts sampling at the last training timestep: pure noise."""
    return {"prediction_type": schedule.objective, "timestep_spacing": "trailing"}


def _ddim(schedule: DDPMSchedule) -> SchedulerMixin:
    """``clip_sample`` off: latents are not bounded to [-1, 1]."""
    return DDIMScheduler.from_config(
        _betas_config(schedule), clip_sample=False, set_alpha_to_one=True, **_sampling_kwargs(schedule)
    )


def _dpmsolver(schedule: DDPMSchedule) -> SchedulerMixin:
    return DPMSolverMultistepScheduler.from_config(
        _betas_config(schedule),
        algorithm_type="dpmsolver++",
        solver_order=2,
        final_sigmas_type="zero",
        **_sampling_kwargs(schedule),
    )


def _diffusers_scheduler(cfg: DiffusionConfig) -> SchedulerMixin:
    """``diffusion.scheduler`` (a diffusers class name), from ``scheduler_pretrained`` or the configured betas."""
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


class DDPMSchedule(NoiseSchedule):
    """epsilon / v-prediction on a DDPM forward process; integer timesteps in [0, T)."""

    samplers = {"ddim": _ddim, "dpmsolver++": _dpmsolver}
    fallback_type = FallbackScheduler

    def __init__(self, scheduler, objective: str, density: TimestepDensity, snr_gamma: float | None = None) -> None:
        super().__init__(scheduler, objective, density)
        self.snr_gamma = snr_gamma

    @classmethod
    def check_config(cls, d: DiffusionConfig) -> None:
        require(
            d.scheduler != FLOW_SCHEDULER,
            "diffusion.objective",
            d.objective,
            f"`{FLOW_SCHEDULER}` (configs/diffusion/flow.yaml) trains with flow matching",
            "set `diffusion.objective=flow_matching` as well (an experiment that sets its own objective keeps it when "
            "`diffusion=flow` is picked; `+experiment=shapes_flow` is shapes with flow matching)",
        )
        require(
            d.flow_weighting == "none",
            "diffusion.flow_weighting",
            d.flow_weighting,
            "it applies to flow matching only; epsilon / v_prediction weight with `diffusion.snr_gamma`",
            "set `diffusion.flow_weighting=none`",
        )
        require(
            not d.resolution_shift,
            "diffusion.resolution_shift",
            d.resolution_shift,
            "it shifts flow matching's noise levels; epsilon / v_prediction have none to shift",
            "set `diffusion.resolution_shift=false`, or train with `diffusion=flow diffusion.objective=flow_matching`",
        )
        if d.scheduler is None:
            require(
                d.beta_schedule in BETA_SCHEDULES,
                "diffusion.beta_schedule",
                d.beta_schedule,
                f"the fallback schedule computes {', '.join(BETA_SCHEDULES)}",
                "set e.g. `diffusion.beta_schedule=linear`",
            )

    @classmethod
    def from_config(cls, cfg: DiffusionConfig, density: TimestepDensity) -> DDPMSchedule:
        """The configured diffusers scheduler, or the fallback with a warning naming why."""
        reason = "no `diffusion.scheduler` is configured"
        if cfg.scheduler is not None:
            try:
                return cls(_diffusers_scheduler(cfg), cfg.objective, density, cfg.snr_gamma)
            except (OSError, ValueError) as error:
                reason = f"`diffusion.scheduler={cfg.scheduler}` could not be loaded ({error})"
        warnings.warn(
            f"{reason}; using the built-in fallback schedule ({cfg.beta_schedule} betas {cfg.beta_start}.."
            f"{cfg.beta_end}, {cfg.num_train_timesteps} steps, DDIM sampling).",
            stacklevel=3,
        )
        fallback = FallbackScheduler(
            cfg.num_train_timesteps, cfg.beta_schedule, cfg.beta_start, cfg.beta_end, cfg.objective
        )
        return cls(fallback, cfg.objective, density, cfg.snr_gamma)

    def sample_timesteps(self, batch_size: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        T = self.num_train_timesteps
        if self.density.kind == "uniform":
            return torch.randint(0, T, (batch_size,), generator=generator, device=device)
        return self.timesteps_at(self.density(batch_size, device, generator))

    def timesteps_at(self, u: torch.Tensor) -> torch.Tensor:
        """Integer timesteps ``floor(u T)`` in [0, T)."""
        T = self.num_train_timesteps
        return (u * T).long().clamp(max=T - 1)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        return self.scheduler.add_noise(x0, noise, timesteps)

    def target(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        if self.objective == "epsilon":
            return noise
        return self.scheduler.get_velocity(x0, noise, timesteps)

    def predicted_x0(self, prediction: torch.Tensor, sample: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """x0 = (x_t - sqrt(1 - a) eps) / sqrt(a), or sqrt(a) x_t - sqrt(1 - a) v, with a = alpha-bar at t."""
        alpha_bar = self.scheduler.alphas_cumprod.to(sample.device)[timesteps.long()]
        alpha_bar = alpha_bar.view(-1, *([1] * (sample.ndim - 1))).to(sample.dtype)
        if self.objective == "epsilon":
            return (sample - (1 - alpha_bar).sqrt() * prediction) / alpha_bar.sqrt()
        return alpha_bar.sqrt() * sample - (1 - alpha_bar).sqrt() * prediction

    def loss_weights(self, timesteps: torch.Tensor) -> torch.Tensor | None:
        """min-SNR-gamma (Hang et al. 2023, with diffusers' ``compute_snr``), or None without ``snr_gamma``."""
        if self.snr_gamma is None:
            return None
        snr = compute_snr(self.scheduler, timesteps)
        clipped = torch.minimum(snr, torch.full_like(snr, self.snr_gamma))
        return clipped / snr if self.objective == "epsilon" else clipped / (snr + 1)

    def policy(
        self, num_steps: int, device: torch.device, noise_level: float | None, stochastic: torch.Tensor | None = None
    ) -> DDIMPolicy:
        """DDIM with eta = ``noise_level`` (default 1) over the DDIM sampler's timesteps; each step goes back
        T // K timesteps, as the DDIM sampler does: past timestep 0 to alpha-bar 1 (a deterministic step), which the
        last step reaches when K divides T."""
        sampler = self.sampler(num_steps, device, "ddim")
        timesteps = sampler.timesteps.to(device)
        alphas_cumprod = sampler.alphas_cumprod.to(device)
        previous = timesteps - self.num_train_timesteps // num_steps
        alpha_bars_next = torch.where(previous >= 0, alphas_cumprod[previous.clamp(min=0)], 1.0)
        every = torch.ones(num_steps, dtype=torch.bool, device=device) if stochastic is None else stochastic
        eta = DEFAULT_ETA if noise_level is None else noise_level
        return DDIMPolicy(alphas_cumprod[timesteps], alpha_bars_next, timesteps, self.objective, eta, every.to(device))
