"""The noise schedule that training and sampling share, one family per kind of forward process.

A ``NoiseSchedule`` owns the forward process (``add_noise``), the regression target of its objective, the loss
weights, where training timesteps fall, and the samplers of the reverse process over the same noise levels, so
training and sampling cannot disagree. ``DDPMSchedule`` (``diffusion.ddpm``: epsilon / v-prediction) and
``FlowSchedule`` (``diffusion.flow``: rectified flow) implement it.
"""

from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.training_utils import compute_density_for_timestep_sampling

from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion.policy import StochasticPolicy
from dit_trainer.registry import lookup


@dataclass
class SchedulerStep:
    """What a fallback sampler's ``step`` returns: the attribute diffusers' schedulers return too."""

    prev_sample: torch.Tensor


@dataclass(frozen=True)
class TimestepDensity:
    """u in [0, 1] from SD3's densities: diffusers' ``compute_density_for_timestep_sampling`` (uniform,
    logit_normal, mode), and cosmap, which diffusers offers only as a loss weighting: u = 1 - 1 / (tan(pi/2 r) + 1).
    """

    kind: str = "uniform"
    logit_mean: float = 0.0
    logit_std: float = 1.0
    mode_scale: float = 1.29

    def __call__(self, batch_size: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        if self.kind == "cosmap":
            r = torch.rand(batch_size, device=device, generator=generator)
            return 1 - 1 / (torch.tan(math.pi / 2 * r) + 1)
        return compute_density_for_timestep_sampling(
            self.kind, batch_size, self.logit_mean, self.logit_std, self.mode_scale, device=device, generator=generator
        ).clamp(0, 1)


class NoiseSchedule(ABC):
    """Timestep sampling, ``x_t``, the objective's target, loss weights and matching samplers, from one scheduler.

    ``scheduler`` is a diffusers scheduler, or the family's built-in fallback with the same interface
    (``is_fallback``). ``samplers`` names the diffusers schedulers that sample this family, each built by a
    function of the schedule: what ``diffusion.sampler`` may be, and what an exported pipeline ships.
    """

    samplers: ClassVar[Mapping[str, Callable[[Any], SchedulerMixin]]]
    fallback_type: ClassVar[type]

    def __init__(self, scheduler: Any, objective: str, density: TimestepDensity) -> None:
        self.scheduler = scheduler
        self.objective = objective
        self.density = density
        self.is_fallback = isinstance(scheduler, self.fallback_type)

    @property
    def num_train_timesteps(self) -> int:
        if self.is_fallback:
            return self.scheduler.num_train_timesteps
        return self.scheduler.config.num_train_timesteps

    @classmethod
    @abstractmethod
    def check_config(cls, d: DiffusionConfig) -> None:
        """Refuse ``diffusion.*`` settings this family does not train or sample with (checked with the config,
        before any model is built)."""

    @abstractmethod
    def sample_timesteps(self, batch_size: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
        """Training timesteps (B,) drawn from ``density``."""

    @abstractmethod
    def timesteps_at(self, u: torch.Tensor) -> torch.Tensor:
        """The timesteps at quantiles ``u`` in [0, 1) of the noise range, mapped as training maps its density's
        draws (flow: shifted sigma)."""

    def stratified_timesteps(self, count: int, device: torch.device) -> torch.Tensor:
        """``count`` fixed timesteps at the centres of equal strata of the noise range: what validation uses, so
        its loss compares across steps and runs whatever the training density."""
        return self.timesteps_at((torch.arange(count, device=device, dtype=torch.float64) + 0.5) / count)

    @abstractmethod
    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """``x_t``: ``x0`` noised to the level of ``timesteps``."""

    @abstractmethod
    def target(self, x0: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """What the DiT learns to predict from ``x_t``."""

    @abstractmethod
    def predicted_x0(self, prediction: torch.Tensor, sample: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
        """The clean latents a ``prediction`` of the objective's target at ``sample`` (x_t) implies: an affine map of
        the prediction, so mixing predictions mixes their x0 alike (what DiffusionNFT's implicit policies need)."""

    @abstractmethod
    def loss_weights(self, timesteps: torch.Tensor) -> torch.Tensor | None:
        """Per-sample weights (B,) for the (B,) loss, or None for an unweighted mean."""

    def diffusers_sampler(self, kind: str) -> SchedulerMixin:
        """The diffusers scheduler that samples this schedule with ``kind``: what an exported pipeline ships."""
        return lookup(self.samplers, "diffusion.sampler", kind)(self)

    def sampler(self, num_steps: int, device: torch.device, kind: str | None = None) -> Any:
        """A fresh deterministic sampler of ``kind`` (default: the family's first) with its timesteps set. Without a
        diffusers scheduler, the family's first sampler is the fallback's own."""
        own = next(iter(self.samplers))
        if self.is_fallback and kind in (None, own):
            sampler = copy.copy(self.scheduler)
        else:
            sampler = self.diffusers_sampler(kind or own)
        self.set_timesteps(sampler, num_steps, device)
        return sampler

    def set_timesteps(self, sampler: Any, num_steps: int, device: torch.device) -> None:
        """Set ``sampler``'s grid of ``num_steps`` (a family may pick its own, as Flux's pipeline does)."""
        sampler.set_timesteps(num_steps, device=device)

    def at_size(self, latent_shape: tuple[int, ...]) -> NoiseSchedule:
        """The schedule for latents of ``latent_shape`` (..., H, W): itself, unless its noise levels depend on the
        image size (flow matching with ``diffusion.resolution_shift``). Whatever draws timesteps or samples for
        known latents asks for it."""
        return self

    @abstractmethod
    def policy(
        self, num_steps: int, device: torch.device, noise_level: float | None, stochastic: torch.Tensor | None = None
    ) -> StochasticPolicy:
        """GRPO's stochastic policy over the grid of the family's first sampler (``sampler(num_steps)``): the same
        timesteps, and with ``noise_level`` 0 the same steps. ``noise_level`` None is the family's default;
        ``stochastic`` (K,) bools picks the steps that draw noise (default: all that can)."""
