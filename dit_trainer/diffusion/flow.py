"""The flow-matching family (rectified flow, as SD3, Flux and Sana): x_t = (1 - sigma) x0 + sigma eps, the DiT
predicts the velocity eps - x0, and Euler steps integrate it from sigma 1 to 0. Timesteps are sigma * T."""

from __future__ import annotations

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


def _euler(schedule: FlowSchedule) -> SchedulerMixin:
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=schedule.num_train_timesteps, shift=schedule.shift)


class FlowSchedule(NoiseSchedule):
    """Flow matching; the math is ours, the scheduler only samples (diffusers' Euler, or the fallback's)."""

    samplers = {"euler": _euler}
    fallback_type = FallbackFlowScheduler

    def __init__(self, scheduler, density: TimestepDensity, shift: float = 1.0, weighting: str = "none") -> None:
        super().__init__(scheduler, "flow_matching", density)
        self.shift = shift
        self.weighting = weighting

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
            d.scheduler in (None, FLOW_SCHEDULER),
            "diffusion.scheduler",
            d.scheduler,
            f"flow matching uses `{FLOW_SCHEDULER}` (or null for the built-in Euler)",
            f"set `diffusion.scheduler={FLOW_SCHEDULER}` (configs/diffusion/flow.yaml does)",
        )

    @classmethod
    def from_config(cls, cfg: DiffusionConfig, density: TimestepDensity) -> FlowSchedule:
        """Diffusers' Euler scheduler samples when ``diffusion.scheduler`` is set, else the built-in Euler."""
        if cfg.scheduler is None:
            scheduler = FallbackFlowScheduler(cfg.num_train_timesteps, cfg.shift)
        else:
            scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=cfg.num_train_timesteps, shift=cfg.shift)
        return cls(scheduler, density, cfg.shift, cfg.flow_weighting)

    def sample_timesteps(self, batch_size: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        """Floats sigma * T in (0, T], sigma shifted by ``shift``."""
        return self.timesteps_at(self.density(batch_size, device, generator))

    def timesteps_at(self, u: torch.Tensor) -> torch.Tensor:
        return (shift_sigmas(u, self.shift) * self.num_train_timesteps).float()

    def sigmas(self, timesteps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The noise level sigma = t / T, shaped to broadcast against ``like``."""
        return (timesteps.float() / self.num_train_timesteps).view(-1, *([1] * (like.ndim - 1))).to(like.dtype)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        sigma = self.sigmas(timesteps, x0)
        return (1 - sigma) * x0 + sigma * noise

    def target(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        return noise - x0

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
