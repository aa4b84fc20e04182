"""Flow-GRPO's coefficients-preserving sampler (``FlowCPSPolicy``, ``grpo.sde_type=cps``): with no noise it is the
Euler step, its std is sigma' sin(a pi / 2), its mean keeps x_sigma's coefficients, and the log-prob of its own
sample is the finite Gaussian density; ``build_policy`` gives it for flow matching, over the SDE's window."""

import dataclasses
import math

import pytest
import torch

from dit_trainer.config import TrainConfig
from dit_trainer.diffusion.policy import FlowCPSPolicy, gaussian_log_prob
from dit_trainer.grpo.build import build_policy

from .conftest import CPU, FLOW, schedule_of

SHAPE, NUM_STEPS = (3, 4, 4, 4), 10


def cps(noise_level: float, window: torch.Tensor | None = None) -> tuple[FlowCPSPolicy, object]:
    """The CPS policy over the fallback flow schedule's Euler grid, and that Euler sampler."""
    schedule = schedule_of("flow", None)
    sde = schedule.policy(NUM_STEPS, CPU, noise_level, window)
    return FlowCPSPolicy(sde.sigmas, sde.timesteps, noise_level, sde.stochastic), schedule.sampler(NUM_STEPS, CPU)


def rows(index: int) -> torch.Tensor:
    return torch.full((SHAPE[0],), index, dtype=torch.long)


def test_with_no_noise_the_cps_step_is_the_euler_step():
    policy, sampler = cps(0.0)
    assert not policy.stochastic.any()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SHAPE, generator=generator)
    for i, t in enumerate(sampler.timesteps):
        v = torch.randn(SHAPE, generator=generator)
        mean, std = policy.distribution(x, v, rows(i))
        torch.testing.assert_close(mean, sampler.step(v, t, x).prev_sample, rtol=1e-6, atol=1e-5)
        assert not std.any() and policy.step(x, v, i, generator)[1] is None
        x = mean


@pytest.mark.parametrize("noise_level", [0.8, 0.5])
def test_the_cps_std_and_mean_follow_flow_grpos_formulas(noise_level):
    """std = sigma' sin(a pi / 2); mean = x0 (1 - sigma') + x1 sqrt(sigma'^2 - std^2) with x0 = x - sigma v and
    x1 = x + (1 - sigma) v; the last step (to sigma 0) draws nothing."""
    policy, _ = cps(noise_level)
    assert policy.stochastic[:-1].all() and not policy.stochastic[-1]
    generator = torch.Generator().manual_seed(1)
    x, v = torch.randn(SHAPE, generator=generator), torch.randn(SHAPE, generator=generator)
    for i in range(NUM_STEPS):
        sigma, sigma_next = policy.sigmas[i].item(), policy.sigmas[i + 1].item()
        std = sigma_next * math.sin(noise_level * math.pi / 2)
        x0, x1 = x - sigma * v, x + (1 - sigma) * v
        expected = x0 * (1 - sigma_next) + x1 * math.sqrt(sigma_next**2 - std**2)
        mean, got_std = policy.distribution(x, v, rows(i))
        torch.testing.assert_close(got_std, torch.full_like(got_std, std), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(mean, expected, rtol=1e-5, atol=1e-6)
    assert policy.sigmas[-1] == 0


def test_the_log_prob_of_a_cps_sample_is_its_finite_gaussian_density():
    """Every noisy step, the first at sigma = 1 included, draws a sample whose log-prob is finite and the density
    of that sample under the step's (mean, std), as a training forward recomputes it."""
    policy, _ = cps(0.8)
    assert policy.sigmas[0] == 1
    generator = torch.Generator().manual_seed(2)
    x, v = torch.randn(SHAPE, generator=generator), torch.randn(SHAPE, generator=generator)
    for i in range(NUM_STEPS - 1):
        sample, log_prob = policy.step(x, v, i, generator)
        mean, std = policy.distribution(x, v, rows(i))
        assert torch.isfinite(sample).all() and torch.isfinite(log_prob).all() and not torch.equal(sample, mean)
        torch.testing.assert_close(log_prob, gaussian_log_prob(sample, mean, std), rtol=0, atol=0)
        normal = torch.distributions.Normal(mean, std.expand_as(mean)).log_prob(sample).mean(dim=(1, 2, 3))
        torch.testing.assert_close(log_prob, normal, rtol=1e-5, atol=1e-5)


def test_build_policy_gives_cps_for_flow_matching_over_the_window():
    cfg = TrainConfig()
    grpo = dataclasses.replace(cfg.grpo, sample_steps=NUM_STEPS, sde_type="cps", sde_start=1, sde_steps=3)
    cfg = dataclasses.replace(cfg, diffusion=dataclasses.replace(cfg.diffusion, **FLOW), grpo=grpo)
    policy = build_policy(cfg.grpo, schedule_of("flow", None), CPU)
    assert isinstance(policy, FlowCPSPolicy) and policy.noise_level == 0.7  # null: the flow family's default
    assert torch.nonzero(policy.stochastic).flatten().tolist() == [1, 2, 3]
    policy.set_window(torch.arange(NUM_STEPS) >= 7)
    assert torch.nonzero(policy.stochastic).flatten().tolist() == [7, 8]  # never the last step
