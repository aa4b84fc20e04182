"""Noise schedules (``diffusion/schedule.py`` and its families, ``ddpm.py``, ``flow.py``): the forward process, the
targets, timestep densities and loss weights on hand-computed tensors, the fallback schedulers against diffusers',
and samplers that recover x0 from a perfect predictor."""

import math

import pytest
import torch
from diffusers import DDPMScheduler
from diffusers.training_utils import compute_density_for_timestep_sampling

from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion.build import build_noise_schedule
from dit_trainer.diffusion.ddpm import FallbackScheduler
from dit_trainer.diffusion.schedule import NoiseSchedule
from dit_trainer.errors import ConfigError

from ..conftest import TINY_SHAPES, compose_config

FLOW = {"scheduler": "FlowMatchEulerDiscreteScheduler", "objective": "flow_matching", "sampler": "euler"}


def test_fallback_forward_process_matches_its_definition():
    scheduler = FallbackScheduler(num_train_timesteps=10, beta_schedule="linear", beta_start=0.1, beta_end=0.5)
    betas = torch.linspace(0.1, 0.5, 10, dtype=torch.float64)
    alpha_bar = torch.cumprod(1 - betas, 0)
    x0, noise, t = torch.full((2, 1, 2, 2), 2.0), torch.full((2, 1, 2, 2), -1.0), torch.tensor([0, 9])
    expected = alpha_bar.sqrt()[t].view(2, 1, 1, 1) * 2 - (1 - alpha_bar).sqrt()[t].view(2, 1, 1, 1)
    torch.testing.assert_close(scheduler.add_noise(x0, noise, t), expected.float().expand_as(x0))
    velocity = alpha_bar.sqrt()[t].view(2, 1, 1, 1) * -1 - (1 - alpha_bar).sqrt()[t].view(2, 1, 1, 1) * 2
    torch.testing.assert_close(scheduler.get_velocity(x0, noise, t), velocity.float().expand_as(x0))


@pytest.mark.parametrize("beta_schedule", ["linear", "scaled_linear", "squaredcos_cap_v2"])
def test_fallback_matches_diffusers_ddpm(beta_schedule):
    ours = FallbackScheduler(1000, beta_schedule)
    theirs = DDPMScheduler(num_train_timesteps=1000, beta_schedule=beta_schedule)
    x0, noise, t = torch.randn(4, 3, 4, 4), torch.randn(4, 3, 4, 4), torch.tensor([0, 10, 500, 999])
    torch.testing.assert_close(ours.add_noise(x0, noise, t), theirs.add_noise(x0, noise, t), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.get_velocity(x0, noise, t), theirs.get_velocity(x0, noise, t), atol=1e-5, rtol=1e-5)


def _oracle_sample(schedule: NoiseSchedule, x0: torch.Tensor, steps: int, kind: str = "ddim") -> torch.Tensor:
    """Sample with a model that knows x0 and returns the exact target for the current x_t."""
    sampler = schedule.sampler(steps, torch.device("cpu"), kind)
    x = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    for t in sampler.timesteps:
        t_batch = t.reshape(1).expand(x0.shape[0])
        alpha_bar = schedule.scheduler.alphas_cumprod[t_batch].view(-1, 1, 1, 1).float()
        noise = (x - alpha_bar.sqrt() * x0) / (1 - alpha_bar).sqrt()  # the noise that makes x from x0
        x = sampler.step(schedule.target(x0, noise, t_batch), t, x).prev_sample
    return x


@pytest.mark.parametrize("kind", ["ddim", "dpmsolver++"])
@pytest.mark.parametrize("scheduler", [None, "DDPMScheduler"])
@pytest.mark.parametrize("objective", ["epsilon", "v_prediction"])
def test_sampler_recovers_x0_from_a_perfect_predictor(scheduler, objective, kind):
    with pytest.warns(UserWarning) if scheduler is None else _no_warning():
        schedule = build_noise_schedule(DiffusionConfig(scheduler=scheduler, objective=objective))
    assert schedule.is_fallback == (scheduler is None)
    x0 = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(1)).clamp(-2, 2)
    torch.testing.assert_close(_oracle_sample(schedule, x0, steps=10, kind=kind), x0, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("scheduler", [None, "FlowMatchEulerDiscreteScheduler"])
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_euler_recovers_x0_from_a_perfect_flow_predictor(scheduler, shift):
    schedule = build_noise_schedule(DiffusionConfig(**{**FLOW, "scheduler": scheduler, "shift": shift}))
    assert schedule.is_fallback == (scheduler is None)
    x0 = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    sampler = schedule.sampler(10, torch.device("cpu"), "euler")
    x = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    for t in sampler.timesteps:
        t_batch = t.reshape(1).expand(3)
        sigma = schedule.sigmas(t_batch, x0)
        noise = (x - (1 - sigma) * x0) / sigma  # the noise that makes x from x0 at this sigma
        x = sampler.step(schedule.target(x0, noise, t_batch), t, x).prev_sample
    torch.testing.assert_close(x, x0, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("objective", ["epsilon", "v_prediction"])
def test_fallback_ddim_is_the_same_sampler_as_diffusers_ddim_over_its_betas(objective):
    """The fallback's own sampler and the diffusers scheduler an export ships must produce the same chain."""
    with pytest.warns(UserWarning):
        schedule = build_noise_schedule(DiffusionConfig(scheduler=None, objective=objective))
    ours, theirs = schedule.sampler(6, torch.device("cpu")), schedule.diffusers_sampler("ddim")
    theirs.set_timesteps(6)  # 6 does not divide 1000: both must step back the same way
    assert torch.equal(ours.timesteps, theirs.timesteps)
    generator = torch.Generator().manual_seed(3)
    x_ours = x_theirs = torch.randn(2, 4, 8, 8, generator=generator)
    for t in ours.timesteps:
        output = torch.randn(2, 4, 8, 8, generator=generator)  # any model output: the update rule must agree
        x_ours = ours.step(output, t, x_ours).prev_sample
        x_theirs = theirs.step(output, t, x_theirs).prev_sample
    torch.testing.assert_close(x_ours, x_theirs, atol=1e-4, rtol=1e-4)


def test_unknown_sampler_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="diffusion.sampler"):
        build_noise_schedule(DiffusionConfig()).sampler(10, torch.device("cpu"), "euler")


def test_flow_matching_noise_and_target_follow_their_definition():
    schedule = build_noise_schedule(DiffusionConfig(**FLOW))
    x0, noise = torch.full((2, 1, 2, 2), 2.0), torch.full((2, 1, 2, 2), -1.0)
    t = torch.tensor([250.0, 1000.0])  # sigma 0.25 and 1
    expected = torch.tensor([0.75 * 2 + 0.25 * -1, -1.0]).view(2, 1, 1, 1).expand_as(x0)
    torch.testing.assert_close(schedule.add_noise(x0, noise, t), expected)
    torch.testing.assert_close(schedule.target(x0, noise, t), torch.full_like(x0, -3.0))


def test_training_targets_follow_the_objective():
    """DDPM's forward process and targets by their definitions, with each sample's own timestep: x_t = sqrt(a) x0 +
    sqrt(1 - a) eps (a: alpha-bar), epsilon's target the noise, v's sqrt(a) eps - sqrt(1 - a) x0 (diffusers'
    ``get_velocity``); uniform training timesteps cover the whole schedule."""
    x0, noise, t = torch.randn(2, 4, 4, 4), torch.randn(2, 4, 4, 4), torch.tensor([3, 700])
    eps = build_noise_schedule(DiffusionConfig(objective="epsilon"))
    v = build_noise_schedule(DiffusionConfig(objective="v_prediction"))
    a = eps.scheduler.alphas_cumprod[t].view(2, 1, 1, 1)
    for schedule in (eps, v):
        torch.testing.assert_close(schedule.add_noise(x0, noise, t), a.sqrt() * x0 + (1 - a).sqrt() * noise)
    assert torch.equal(eps.target(x0, noise, t), noise)
    torch.testing.assert_close(v.target(x0, noise, t), a.sqrt() * noise - (1 - a).sqrt() * x0)
    torch.testing.assert_close(v.target(x0, noise, t), DDPMScheduler().get_velocity(x0, noise, t))
    timesteps = eps.sample_timesteps(10_000, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert timesteps.min() == 0 and timesteps.max() == 999


def test_fallback_is_used_with_a_warning_naming_why():
    with pytest.warns(UserWarning, match="no `diffusion.scheduler` is configured"):
        assert build_noise_schedule(DiffusionConfig(scheduler=None)).is_fallback
    with pytest.warns(UserWarning, match="NotAScheduler"):
        assert build_noise_schedule(DiffusionConfig(scheduler="NotAScheduler")).is_fallback
    with pytest.warns(UserWarning, match="could not be loaded"):
        assert build_noise_schedule(DiffusionConfig(scheduler_pretrained="/nonexistent/scheduler")).is_fallback


class _no_warning:
    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error", UserWarning)

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


@pytest.mark.parametrize("kind", ["ddim", "dpmsolver++"])
@pytest.mark.parametrize("scheduler", [None, "DDPMScheduler"])
def test_samplers_start_from_pure_noise_at_the_last_training_timestep(scheduler, kind):
    """Trailing spacing and the objective must reach the diffusers sampler (what exports ship too): from_config
    silently drops config entries it considers defaults, such as timestep_spacing."""
    with pytest.warns(UserWarning) if scheduler is None else _no_warning():
        schedule = build_noise_schedule(DiffusionConfig(scheduler=scheduler, objective="v_prediction"))
    sampler = schedule.diffusers_sampler(kind)
    assert sampler.config.timestep_spacing == "trailing" and sampler.config.prediction_type == "v_prediction"
    sampler.set_timesteps(10)
    assert sampler.timesteps[0] == 999 and schedule.sampler(10, torch.device("cpu"), kind).timesteps[0] == 999


def test_min_snr_weights_equal_the_formula():
    t = torch.tensor([0, 100, 500, 999])
    for objective, denominator in (("epsilon", 0.0), ("v_prediction", 1.0)):
        schedule = build_noise_schedule(DiffusionConfig(objective=objective, snr_gamma=5.0))
        a = schedule.scheduler.alphas_cumprod[t].double()
        snr = a / (1 - a)
        expected = torch.minimum(snr, torch.full_like(snr, 5.0)) / (snr + denominator)
        torch.testing.assert_close(schedule.loss_weights(t).double(), expected, rtol=1e-5, atol=0)
    assert build_noise_schedule(DiffusionConfig()).loss_weights(t) is None


def test_flow_weightings_and_densities_are_diffusers_formulas():
    schedule = build_noise_schedule(DiffusionConfig(**FLOW, flow_weighting="cosmap"))
    t = torch.tensor([250.0, 500.0])
    sigma = t / 1000
    torch.testing.assert_close(schedule.loss_weights(t), 2 / (math.pi * (1 - 2 * sigma + 2 * sigma**2)))
    sqrt = build_noise_schedule(DiffusionConfig(**FLOW, flow_weighting="sigma_sqrt"))
    torch.testing.assert_close(sqrt.loss_weights(t), sigma**-2)
    for kind in ("logit_normal", "mode"):
        cfg = DiffusionConfig(**FLOW, timestep_sampling=kind)
        ours = build_noise_schedule(cfg).sample_timesteps(6, torch.device("cpu"), torch.Generator().manual_seed(4))
        u = compute_density_for_timestep_sampling(kind, 6, 0.0, 1.0, 1.29, generator=torch.Generator().manual_seed(4))
        torch.testing.assert_close(ours, u.clamp(0, 1) * 1000)
    cosmap = DiffusionConfig(**FLOW, timestep_sampling="cosmap")
    t = build_noise_schedule(cosmap).sample_timesteps(4096, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert t.min() >= 0 and t.max() <= 1000 and abs(t.float().median().item() - 500) < 40  # symmetric about 0.5


@pytest.mark.parametrize("overrides", [[], ["diffusion=flow", "diffusion.objective=flow_matching"]])
def test_stratified_timesteps_sit_at_the_centres_of_equal_strata(overrides):
    schedule = build_noise_schedule(compose_config([*TINY_SHAPES, *overrides]).diffusion)
    timesteps = schedule.stratified_timesteps(4, torch.device("cpu"))
    assert timesteps.tolist() == pytest.approx([125, 375, 625, 875], abs=0.5)
