"""Stochastic sampling policies with exact log-probabilities (``diffusion/policy.py``)."""

import math
import warnings

import pytest
import torch

from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion.build import build_noise_schedule
from dit_trainer.diffusion.policy import gaussian_log_prob
from dit_trainer.diffusion.schedule import NoiseSchedule

CPU = torch.device("cpu")
SHAPE = (3, 4, 4, 4)

FLOW_EULER = {"objective": "flow_matching", "scheduler": "FlowMatchEulerDiscreteScheduler", "sampler": "euler"}
# (schedule config, rtol): the fallback DDIM computes its coefficients in double, hence its looser tolerance.
DETERMINISTIC_CASES = {
    "ddim-v": ({"objective": "v_prediction"}, 1e-6),
    "fallback-ddim-eps": ({"objective": "epsilon", "scheduler": None}, 1e-5),
    "fallback-ddim-v": ({"objective": "v_prediction", "scheduler": None}, 1e-5),
    "flow-euler": ({**FLOW_EULER, "shift": 3.0}, 1e-6),
    "fallback-flow": ({"objective": "flow_matching", "scheduler": None, "sampler": "euler"}, 1e-6),
}
FLOW = DETERMINISTIC_CASES["fallback-flow"][0]
DDIM = DETERMINISTIC_CASES["ddim-v"][0]


def _schedule(**kwargs) -> NoiseSchedule:
    """The schedule ``DiffusionConfig(**kwargs)`` builds (the fallback's warning is not what these tests check)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return build_noise_schedule(DiffusionConfig(**kwargs))


def _rows(index: int, batch: int = SHAPE[0]) -> torch.Tensor:
    return torch.full((batch,), index, dtype=torch.long)


@pytest.mark.parametrize("num_steps", [10, 7])
@pytest.mark.parametrize("case", list(DETERMINISTIC_CASES))
def test_noiseless_policy_is_the_deterministic_sampler(case, num_steps):
    """With noise_level 0 every step's mean is the sampler's step (std 0, no log-prob), along a whole trajectory."""
    kwargs, rtol = DETERMINISTIC_CASES[case]
    schedule = _schedule(**kwargs)
    policy, sampler = schedule.policy(num_steps, CPU, 0.0), schedule.sampler(num_steps, CPU)
    assert policy.num_steps == num_steps
    torch.testing.assert_close(policy.timesteps, sampler.timesteps)
    assert not policy.stochastic.any()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SHAPE, generator=generator)
    for i, t in enumerate(sampler.timesteps):
        prediction = torch.randn(SHAPE, generator=generator)
        mean, std = policy.distribution(x, prediction, _rows(i))
        stepped, log_prob = policy.step(x, prediction, i, generator)
        expected = sampler.step(prediction, t, x).prev_sample
        torch.testing.assert_close(mean, expected, rtol=rtol, atol=1e-5)
        assert torch.equal(stepped, mean) and log_prob is None
        assert std.shape == (SHAPE[0], 1, 1, 1) and not std.any()
        x = expected


@pytest.mark.parametrize("kwargs", [FLOW, DDIM], ids=["flow", "ddim"])
def test_a_step_marked_deterministic_is_the_sampler_step_even_with_noise(kwargs):
    """``stochastic`` False at a step: its mean is the deterministic step, std 0 and no log-prob; the others draw."""
    schedule, num_steps, quiet = _schedule(**kwargs), 6, 2
    stochastic = torch.ones(num_steps, dtype=torch.bool)
    stochastic[quiet] = False
    policy, sampler = schedule.policy(num_steps, CPU, 0.7, stochastic), schedule.sampler(num_steps, CPU)
    assert policy.stochastic[:-1].tolist() == [i != quiet for i in range(num_steps - 1)]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SHAPE, generator=generator)
    for i, t in enumerate(sampler.timesteps[:-1]):
        prediction = torch.randn(SHAPE, generator=generator)
        mean, std = policy.distribution(x, prediction, _rows(i))
        stepped, log_prob = policy.step(x, prediction, i, generator)
        expected = sampler.step(prediction, t, x).prev_sample
        if i == quiet:
            torch.testing.assert_close(mean, expected, rtol=1e-6, atol=1e-5)
            assert not std.any() and log_prob is None and torch.equal(stepped, mean)
        else:
            assert (std > 0).all() and log_prob is not None and not torch.equal(stepped, mean)
        x = expected


@pytest.mark.parametrize("kwargs", [FLOW, DDIM], ids=["flow", "ddim"])
def test_rows_of_one_batch_may_sit_at_different_steps(kwargs):
    """``distribution`` with a (B,) index of mixed steps gives each row what that row's step alone gives."""
    policy = _schedule(**kwargs).policy(8, CPU, None)
    generator = torch.Generator().manual_seed(0)
    x, prediction = torch.randn(SHAPE, generator=generator), torch.randn(SHAPE, generator=generator)
    index = torch.tensor([0, 5, 7])
    mean, std = policy.distribution(x, prediction, index)
    for row, i in enumerate(index.tolist()):
        row_mean, row_std = policy.distribution(x[row : row + 1], prediction[row : row + 1], _rows(i, 1))
        torch.testing.assert_close(mean[row : row + 1], row_mean)
        torch.testing.assert_close(std[row : row + 1], row_std)
    assert std[0] != std[1] and std[2] == 0  # distinct steps really were read, the last is deterministic


@pytest.mark.parametrize("std_shape", [(), (3, 1, 1, 1)], ids=["scalar-std", "per-row-std"])
def test_gaussian_log_prob_is_the_normal_density_averaged_over_dimensions(std_shape):
    """(B,) mean over all but the first dimension of Normal(mean, std).log_prob(sample), std scalar or per row."""
    generator = torch.Generator().manual_seed(0)
    sample, mean = torch.randn(3, 4, 5, 6, generator=generator), torch.randn(3, 4, 5, 6, generator=generator)
    std = torch.rand(std_shape, generator=generator) + 0.1
    expected = torch.distributions.Normal(mean, std).log_prob(sample).mean(dim=(1, 2, 3))
    got = gaussian_log_prob(sample, mean, std)
    assert got.shape == (3,) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kwargs", [FLOW, DDIM], ids=["flow", "ddim"])
def test_noisy_step_log_prob_is_that_of_its_sample_and_the_step_is_seeded(kwargs):
    """A stochastic step's log-prob is the density of the returned sample under ``distribution`` (recomputed);
    the same generator seed gives the same step, another seed another one."""
    policy = _schedule(**kwargs).policy(10, CPU, 0.9)
    generator = torch.Generator().manual_seed(0)
    x, prediction = torch.randn(SHAPE, generator=generator), torch.randn(SHAPE, generator=generator)
    for i in (0, 4, 8):
        assert policy.stochastic[i]
        sample, log_prob = policy.step(x, prediction, i, torch.Generator().manual_seed(7))
        mean, std = policy.distribution(x, prediction, _rows(i))
        torch.testing.assert_close(log_prob, gaussian_log_prob(sample, mean, std), rtol=1e-6, atol=1e-6)
        normal = torch.distributions.Normal(mean, std.expand_as(mean)).log_prob(sample).mean(dim=(1, 2, 3))
        torch.testing.assert_close(log_prob, normal, rtol=1e-5, atol=1e-5)
        assert not torch.equal(sample, mean)
        again, again_log_prob = policy.step(x, prediction, i, torch.Generator().manual_seed(7))
        assert torch.equal(again, sample) and torch.equal(again_log_prob, log_prob)
        other, _ = policy.step(x, prediction, i, torch.Generator().manual_seed(8))
        assert not torch.equal(other, sample)


@pytest.mark.parametrize(
    "kwargs",
    [FLOW, DETERMINISTIC_CASES["flow-euler"][0], DDIM, DETERMINISTIC_CASES["fallback-ddim-eps"][0]],
    ids=["fallback-flow", "flow-euler", "ddim", "fallback-ddim"],
)
def test_last_step_is_deterministic(kwargs):
    """The step into the image (sigma 0, alpha-bar 1) draws no noise, even at the default noise level."""
    policy = _schedule(**kwargs).policy(10, CPU, None)
    assert policy.stochastic[:-1].all() and not policy.stochastic[-1]
    x, prediction = torch.randn(SHAPE), torch.randn(SHAPE)
    _, std = policy.distribution(x, prediction, _rows(9))
    assert not std.any()
    assert policy.step(x, prediction, 9, torch.Generator().manual_seed(0))[1] is None


@pytest.mark.parametrize("kwargs", [FLOW, DETERMINISTIC_CASES["flow-euler"][0]], ids=["fallback-flow", "flow-euler"])
def test_first_flow_step_at_sigma_one_has_finite_noise(kwargs):
    """At sigma = 1 the SDE's std a sqrt(sigma / (1 - sigma)) would be infinite: the step is still finite, its
    denominator taking the grid's second sigma and its numerator sigma = 1, as Flow-GRPO's."""
    policy = _schedule(**kwargs).policy(10, CPU, 0.7)
    assert policy.sigmas[0] == 1 and policy.stochastic[0]
    x, prediction = torch.randn(SHAPE), torch.randn(SHAPE)
    mean, std = policy.distribution(x, prediction, _rows(0))
    assert torch.isfinite(mean).all() and torch.isfinite(std).all() and (std > 0).all()
    sigma_max, dt = policy.sigmas[1].item(), (policy.sigmas[1] - policy.sigmas[0]).item()
    torch.testing.assert_close(std, torch.full_like(std, 0.7 * math.sqrt(1 / (1 - sigma_max)) * math.sqrt(-dt)))
    sample, log_prob = policy.step(x, prediction, 0, torch.Generator().manual_seed(0))
    assert torch.isfinite(sample).all() and torch.isfinite(log_prob).all()


def _gaussian_velocity(x: torch.Tensor, sigma: float, m: float, s: float) -> torch.Tensor:
    """The exact rectified-flow velocity E[eps - x0 | x_sigma] for data x0 ~ N(m, s^2)."""
    x0 = m + (1 - sigma) * s**2 / ((1 - sigma) ** 2 * s**2 + sigma**2) * (x - (1 - sigma) * m)
    eps = (x - (1 - sigma) * x0) / sigma
    return eps - x0


def test_flow_sde_keeps_the_marginals():
    """With the exact velocity of Gaussian data, sampling with noise at every step but the last still lands on the
    data distribution: the drift correction compensates the injected noise."""
    m, s, num_steps = 0.5, 0.3, 120
    policy = _schedule(**FLOW).policy(num_steps, CPU, 0.7)
    assert policy.stochastic[:-1].all()
    generator = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 20k-element ops: threads only contend on a busy 2-core machine
    try:
        x = torch.randn(20_000, 1, 1, 1, generator=generator)
        for i in range(num_steps):
            x, _ = policy.step(x, _gaussian_velocity(x, policy.sigmas[i].item(), m, s), i, generator)
    finally:
        torch.set_num_threads(threads)
    assert abs(x.mean().item() - m) < 0.02
    assert abs(x.std().item() / s - 1) < 0.025


@pytest.mark.parametrize("num_steps", [10, 7])
@pytest.mark.parametrize("scheduler", ["DDPMScheduler", None])
def test_ddim_policy_is_diffusers_ddim_with_eta(scheduler, num_steps):
    """std = eta sqrt(DDIMScheduler._get_variance(t, t - T // K)), and the mean is diffusers' DDIM step with that
    eta and zero noise, at every step."""
    eta, objective = 0.8, "v_prediction" if scheduler else "epsilon"
    schedule = _schedule(objective=objective, scheduler=scheduler)
    policy = schedule.policy(num_steps, CPU, eta)
    ddim = schedule.diffusers_sampler("ddim") if schedule.is_fallback else schedule.sampler(num_steps, CPU, "ddim")
    ddim.set_timesteps(num_steps, device=CPU)
    assert torch.equal(policy.timesteps, ddim.timesteps)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SHAPE, generator=generator)
    for i, t in enumerate(ddim.timesteps):
        prediction = torch.randn(SHAPE, generator=generator)
        mean, std = policy.distribution(x, prediction, _rows(i))
        previous = int(t) - schedule.num_train_timesteps // num_steps
        if hasattr(ddim, "_get_variance"):
            variance = float(ddim._get_variance(t, previous))
        else:  # the DDIM paper's eq. 16, as diffusers computes it
            a = float(ddim.alphas_cumprod[t])
            a_prev = float(ddim.alphas_cumprod[previous]) if previous >= 0 else 1.0
            variance = (1 - a_prev) / (1 - a) * (1 - a / a_prev)
        torch.testing.assert_close(std, torch.full_like(std, eta * math.sqrt(variance)), rtol=1e-5, atol=1e-7)
        expected = ddim.step(prediction, t, x, eta=eta, variance_noise=torch.zeros(SHAPE)).prev_sample
        torch.testing.assert_close(mean, expected, rtol=1e-5, atol=1e-5)
        assert bool(policy.stochastic[i]) == (variance > 0)
        x = mean


@pytest.mark.parametrize("case", list(DETERMINISTIC_CASES))
def test_a_jump_with_the_exact_prediction_lands_on_the_noised_data_at_its_target(case):
    """For one (x0, noise) pair and the prediction that pair implies, a jump between any two grid points lands on
    the pair's noised latent there (at the end: x0, or DDIM's last alpha-bar): the coarser sampler of a compressed
    GRPO tail is exact where the model is; and a one-point jump is the noiseless step. (DDIM, as diffusers', arrives
    at the alpha-bar of the timestep T // K below the one it left, which may differ by one timestep from the next
    grid point's.)"""
    num_steps = 6
    policy = _schedule(**DETERMINISTIC_CASES[case][0]).policy(num_steps, CPU, 0.0)
    generator = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(SHAPE, generator=generator), torch.randn(SHAPE, generator=generator)
    if hasattr(policy, "sigmas"):
        leave = arrive = policy.sigmas.double()  # K + 1 sigmas, 0 at the end

        def noised(level):
            return (1 - level) * x0 + level * noise

        def prediction(level):
            return noise - x0
    else:
        leave = policy.alpha_bars.double()  # alpha-bar a step starts from at each grid point
        arrive = torch.cat([leave[:1], policy.alpha_bars_next.double()])  # and arrives at (1 at the end)

        def noised(level):
            return level.sqrt() * x0 + (1 - level).sqrt() * noise

        def prediction(level):
            return noise if policy.objective == "epsilon" else level.sqrt() * noise - (1 - level).sqrt() * x0

    for index in range(num_steps):
        x, predicted = noised(leave[index]).float(), prediction(leave[index]).float()
        for target in range(index + 1, num_steps + 1):
            landed = policy.jump(x, predicted, index, target)
            torch.testing.assert_close(landed, noised(arrive[target]).float(), rtol=1e-4, atol=1e-4)
        step = policy.distribution(x, predicted, _rows(index))[0]
        torch.testing.assert_close(policy.jump(x, predicted, index, index + 1), step)
