"""Stochastic sampling policies with exact log-probabilities: what GRPO trains.

A policy is the sampler's step made Gaussian: from ``x`` at grid point ``i`` and the DiT's (guided) prediction, the
next latent is drawn from N(mean, std^2 I). With zero noise the mean is exactly the deterministic sampler's step
(Euler for flow matching, DDIM for epsilon / v), so GRPO fine-tunes the sampler users sample with.

- ``FlowSDEPolicy``: Flow-GRPO's ODE-to-SDE conversion of the rectified-flow Euler step, std a * sqrt(sigma /
  (1 - sigma)) with the drift correction that keeps the marginals.
- ``FlowCPSPolicy``: Flow-GRPO's coefficients-preserving sampler (its ``sde_type="cps"``, Flow-GRPO-Fast's), std
  sigma' sin(a pi / 2): the noise replaces part of the Euler step's noise component rather than adding to it.
- ``DDIMPolicy``: DDIM with eta > 0 (DDPO's ``ddim_with_logprob``), for epsilon and v prediction.

All step math is float32. Log-probabilities are the Gaussian log-density averaged over the latent's dimensions
(``gaussian_log_prob``), as every reference implementation does: a mean keeps the per-step log-ratio's scale
independent of the image size, so the PPO clip range (~1e-4) and the learning rate carry over between resolutions.
(A sum is the true log-density of the step; its gradient differs by the constant number of dimensions, which
Adam's normalisation absorbs, but the clip range would have to shrink with the image size.)
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch


def gaussian_log_prob(sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(B,) log N(sample; mean, std^2 I), averaged over all dimensions but the first; float32."""
    sample, mean, std = sample.float(), mean.float(), std.float()
    log_density = -((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return log_density.flatten(1).mean(dim=1)


class StochasticPolicy(ABC):
    """``num_steps`` Gaussian steps over a sampler's grid. ``timesteps[i]`` is what the DiT is conditioned on at step
    ``i``; ``can_draw[i]`` whether step ``i`` has noise to draw at all (a step with std 0, such as the last one, has
    none); ``stochastic[i]`` whether it draws noise now: the window's steps that can (``set_window``)."""

    def __init__(self, timesteps: torch.Tensor, window: torch.Tensor, can_draw: torch.Tensor) -> None:
        self.timesteps = timesteps
        self.can_draw = can_draw
        self.set_window(window)

    def set_window(self, window: torch.Tensor) -> None:
        """Draw noise at the steps of ``window`` (K,) bools that can, deterministic steps elsewhere: GRPO moves its
        window of trained steps between epochs (``grpo.sde_window``)."""
        self.stochastic = window.to(self.can_draw.device) & self.can_draw
        # Read on the host once: ``step`` asks at every denoising step, and a GPU bool read there is a sync.
        self.stochastic_steps: list[bool] = self.stochastic.tolist()

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    @property
    def window_end(self) -> int:
        """One past the last step that draws noise (0 when none does): the steps after it only finish the image."""
        drawn = [index for index, stochastic in enumerate(self.stochastic_steps) if stochastic]
        return drawn[-1] + 1 if drawn else 0

    @abstractmethod
    def distribution(
        self, sample: torch.Tensor, prediction: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of the next latent, float32; ``index`` (B,) is each row's step, so rows of one batch may sit
        at different steps (GRPO's updates batch many steps of many trajectories). std broadcasts (B, 1, 1, 1)."""

    @abstractmethod
    def jump(self, sample: torch.Tensor, prediction: torch.Tensor, index: int, target: int) -> torch.Tensor:
        """The deterministic sampler's step from grid point ``index`` straight to grid point ``target`` (>
        ``index``; ``num_steps`` is the end), float32: a coarser sampler over the same grid, for the steps after
        GRPO's window that only finish the image (``grpo.tail_steps``). ``target = index + 1`` is the step with no
        noise."""

    def step(
        self, sample: torch.Tensor, prediction: torch.Tensor, index: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The next latent and its (B,) log-probability (None for a deterministic step)."""
        rows = torch.full((sample.shape[0],), index, device=sample.device, dtype=torch.long)
        mean, std = self.distribution(sample, prediction, rows)
        if not self.stochastic_steps[index]:
            return mean, None
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        next_sample = mean + std * noise
        return next_sample, gaussian_log_prob(next_sample, mean, std)


def _rows(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[index]`` shaped (B, 1, 1, 1), float32."""
    return values.to(index.device)[index].float().view(-1, 1, 1, 1)


class FlowPolicy(StochasticPolicy):
    """A Gaussian step of rectified flow (x_sigma = (1 - sigma) x0 + sigma eps, prediction v = eps - x0) over the
    Euler sampler's ``sigmas`` with noise level a. The last step (to sigma = 0) is plain Euler: noise there would
    land in the image itself."""

    def __init__(self, sigmas: torch.Tensor, timesteps: torch.Tensor, noise_level: float, stochastic: torch.Tensor):
        super().__init__(timesteps, stochastic, (sigmas[1:] > 0) & (noise_level > 0))
        self.sigmas = sigmas.float()
        self.noise_level = noise_level

    def jump(self, sample: torch.Tensor, prediction: torch.Tensor, index: int, target: int) -> torch.Tensor:
        """Euler from sigma_index to sigma_target (both samplers' step without noise)."""
        return sample.float() + (self.sigmas[target] - self.sigmas[index]).to(sample.device) * prediction.float()


class FlowSDEPolicy(FlowPolicy):
    """Flow-GRPO's SDE for rectified flow.

    With dt = sigma' - sigma < 0 and s = a * sqrt(sigma / (1 - sigma)):
    mean = x (1 + s^2 dt / (2 sigma)) + v (1 + s^2 (1 - sigma) / (2 sigma)) dt, std = s * sqrt(-dt).
    At sigma = 1, s would be infinite: its denominator takes the grid's second sigma instead, the numerator keeps
    sigma = 1 (as Flow-GRPO's ``sd3_sde_with_logprob`` does).
    """

    def distribution(
        self, sample: torch.Tensor, prediction: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sample, prediction = sample.float(), prediction.float()
        sigma, sigma_next = _rows(self.sigmas, index), _rows(self.sigmas, index + 1)
        dt = sigma_next - sigma
        stochastic = _rows(self.stochastic.float(), index)  # s = 0: the mean is exactly the Euler step
        bounded = torch.where(sigma >= 1, self.sigmas[1].to(sigma), sigma)
        s = self.noise_level * torch.sqrt(sigma / (1 - bounded)) * stochastic
        mean = sample * (1 + s**2 / (2 * sigma) * dt) + prediction * (1 + s**2 * (1 - sigma) / (2 * sigma)) * dt
        return mean, s * torch.sqrt(-dt)


class FlowCPSPolicy(FlowPolicy):
    """Flow-GRPO's coefficients-preserving sampler (``sd3_sde_with_logprob``, ``sde_type="cps"``). From the
    prediction's x0 = x - sigma v and noise x1 = x + (1 - sigma) v, the next latent keeps x_sigma's form:
    std = sigma' sin(a pi / 2), mean = x0 (1 - sigma') + x1 sqrt(sigma'^2 - std^2), so the noise it draws takes the
    place of part of x1 instead of being added on top. With std 0 the mean is the Euler step; there is no
    singularity at sigma = 1. It does not keep the data marginal as the SDE does: a different sampler.

    Its log-probability is the Gaussian density (``gaussian_log_prob``) like every policy's here, so the clip range
    and the KL mean the same for all of them; Flow-GRPO's CPS code drops the 1 / (2 std^2) and the normaliser."""

    def distribution(
        self, sample: torch.Tensor, prediction: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sample, prediction = sample.float(), prediction.float()
        sigma, sigma_next = _rows(self.sigmas, index), _rows(self.sigmas, index + 1)
        stochastic = _rows(self.stochastic.float(), index)
        std = sigma_next * math.sin(self.noise_level * math.pi / 2) * stochastic
        x0, x1 = sample - sigma * prediction, sample + (1 - sigma) * prediction
        mean = x0 * (1 - sigma_next) + x1 * torch.sqrt(sigma_next**2 - std**2)
        return mean, std


class DDIMPolicy(StochasticPolicy):
    """DDIM with eta > 0 (Song et al. 2021, eq. 12), for epsilon and v prediction: from alpha-bar a at step i to a'
    (that of the timestep T // K earlier, or 1 after the last, as diffusers' DDIM), sigma_t = eta sqrt((1 - a') /
    (1 - a)) sqrt(1 - a / a') and mean = sqrt(a') x0 + sqrt(1 - a' - sigma_t^2) eps, x0 and eps read from the
    prediction. The last step, to a' = 1, has sigma_t = 0."""

    def __init__(
        self,
        alpha_bars: torch.Tensor,
        alpha_bars_next: torch.Tensor,
        timesteps: torch.Tensor,
        objective: str,
        eta: float,
        stochastic: torch.Tensor,
    ) -> None:
        a, a_next = alpha_bars.double(), alpha_bars_next.double()
        variance = eta**2 * (1 - a_next) / (1 - a) * (1 - a / a_next)
        super().__init__(timesteps, stochastic, variance > 0)
        self.alpha_bars = alpha_bars.float()
        self.alpha_bars_next = alpha_bars_next.float()
        self.objective = objective
        self.variance = variance.float()

    def distribution(
        self, sample: torch.Tensor, prediction: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        a, a_next = _rows(self.alpha_bars, index), _rows(self.alpha_bars_next, index)
        x0, eps = self._x0_and_noise(sample, prediction, a)
        variance = _rows(self.variance, index) * _rows(self.stochastic.float(), index)
        mean = a_next.sqrt() * x0 + (1 - a_next - variance).sqrt() * eps
        return mean, variance.sqrt()

    def jump(self, sample: torch.Tensor, prediction: torch.Tensor, index: int, target: int) -> torch.Tensor:
        """DDIM with eta 0 from grid point ``index``'s alpha-bar to the one a step arrives at on reaching ``target``."""
        a = self.alpha_bars[index].to(sample.device)
        a_target = self.alpha_bars_next[target - 1].to(sample.device)
        x0, eps = self._x0_and_noise(sample, prediction, a)
        return a_target.sqrt() * x0 + (1 - a_target).sqrt() * eps

    def _x0_and_noise(
        self, sample: torch.Tensor, prediction: torch.Tensor, a: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x0, eps) that ``prediction`` implies for ``sample`` at alpha-bar ``a``, float32."""
        sample, prediction = sample.float(), prediction.float()
        if self.objective == "epsilon":
            return (sample - (1 - a).sqrt() * prediction) / a.sqrt(), prediction
        return a.sqrt() * sample - (1 - a).sqrt() * prediction, (1 - a).sqrt() * sample + a.sqrt() * prediction
