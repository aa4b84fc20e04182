"""Flux's resolution-dependent shift (``diffusion.resolution_shift``): our sampler's timesteps are FluxPipeline's
for the image size it samples, training draws more noise for larger images, and with the option off nothing
changes."""

import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift

from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion.build import build_noise_schedule
from dit_trainer.diffusion.ddpm import DDPMSchedule
from dit_trainer.diffusion.flow import FlowSchedule
from dit_trainer.errors import ConfigError

FLUX = {"objective": "flow_matching", "scheduler": "FlowMatchEulerDiscreteScheduler", "sampler": "euler",
        "timestep_sampling": "logit_normal", "resolution_shift": True}  # fmt: skip


def _pipeline_timesteps(latent_side: int, steps: int) -> torch.Tensor:
    """What FluxPipeline sets for a (16, side, side) latent image (FLUX.1-dev's scheduler config)."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)
    mu = calculate_shift((latent_side // 2) ** 2)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    return scheduler.timesteps


@pytest.mark.parametrize("side", [8, 64, 128])
def test_our_sampler_takes_flux_pipeline_s_timesteps_for_the_image_size(side):
    schedule = build_noise_schedule(DiffusionConfig(**FLUX))
    expected = _pipeline_timesteps(side, 6)
    ours = schedule.at_size((16, side, side)).sampler(6, torch.device("cpu"))
    assert torch.equal(ours.timesteps, expected)
    fallback = build_noise_schedule(DiffusionConfig(**(FLUX | {"scheduler": None})))
    torch.testing.assert_close(fallback.at_size((16, side, side)).sampler(6, "cpu").timesteps, expected)
    exported = schedule.diffusers_sampler("euler")  # what an export ships: FluxPipeline computes mu itself
    assert exported.config.use_dynamic_shifting and exported.config.max_image_seq_len == 4096


def test_training_draws_more_noise_for_larger_images_with_the_same_shift_as_sampling():
    schedule = build_noise_schedule(DiffusionConfig(**FLUX))
    u = torch.linspace(0.05, 0.95, 19)
    small, large = schedule.at_size((16, 32, 32)), schedule.at_size((2, 16, 128, 128))
    assert (large.timesteps_at(u) > small.timesteps_at(u)).all()
    shift = math.exp(calculate_shift(64 * 64))
    torch.testing.assert_close(large.timesteps_at(u), 1000 * shift * u / (1 + (shift - 1) * u))
    draws = large.sample_timesteps(4096, torch.device("cpu"), torch.Generator().manual_seed(0)) / 1000
    assert draws.mean() > 0.7  # logit-normal around 0.5, shifted by e^1.15 at 4096 tokens
    with pytest.raises(RuntimeError, match="at_size"):
        schedule.timesteps_at(u)  # the size is needed


def test_off_the_schedule_is_the_fixed_shift_one():
    cfg = DiffusionConfig(**(FLUX | {"resolution_shift": False, "shift": 3.0}))
    schedule = build_noise_schedule(cfg)
    assert schedule.at_size((16, 128, 128)) is schedule
    expected = FlowMatchEulerDiscreteScheduler(shift=3.0)
    expected.set_timesteps(5)
    assert torch.equal(schedule.sampler(5, "cpu").timesteps, expected.timesteps)
    shipped = schedule.diffusers_sampler("euler").config
    assert {k: v for k, v in shipped.items() if not k.startswith("_")} == {
        k: v for k, v in expected.config.items() if not k.startswith("_")
    }


def test_the_option_is_refused_where_it_does_not_apply():
    with pytest.raises(ConfigError, match="`diffusion.resolution_shift`"):
        DDPMSchedule.check_config(DiffusionConfig(resolution_shift=True))
    with pytest.raises(ConfigError, match="`diffusion.shift`"):
        FlowSchedule.check_config(DiffusionConfig(**(FLUX | {"shift": 3.0})))
    with pytest.raises(ConfigError, match="`diffusion.max_image_seq_len`"):
        FlowSchedule.check_config(DiffusionConfig(**(FLUX | {"max_image_seq_len": 256})))
    for elsewhere in ({"resolution_shift": False, "shift": 3.0}, {"scheduler": None}):
        with pytest.raises(ConfigError, match="`diffusion.shift_terminal`"):
            FlowSchedule.check_config(DiffusionConfig(**(FLUX | elsewhere | {"shift_terminal": 0.02})))


def test_qwen_image_s_last_level_is_its_pipeline_s():
    """With ``diffusion.shift_terminal`` (Qwen-Image's 0.02) our sampler steps through QwenImagePipeline's levels for
    the image size (its scheduler config, its grid and mu), and the export ships the stretch; training's timesteps
    are not stretched."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift as qwen_shift

    qwen = FLUX | {"max_shift": 0.9, "max_image_seq_len": 8192, "shift_terminal": 0.02}
    schedule = build_noise_schedule(DiffusionConfig(**qwen))
    theirs = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256, max_image_seq_len=8192,
        shift_terminal=0.02, time_shift_type="exponential",
    )  # fmt: skip
    theirs.set_timesteps(sigmas=np.linspace(1.0, 1 / 8, 8), mu=qwen_shift(64 * 64, 256, 8192, 0.5, 0.9))
    ours = schedule.at_size((16, 128, 128)).sampler(8, torch.device("cpu"))
    torch.testing.assert_close(ours.sigmas, theirs.sigmas, rtol=0, atol=1e-6)
    assert abs(ours.sigmas[-2].item() - 0.02) < 1e-6
    assert schedule.diffusers_sampler("euler").config.shift_terminal == 0.02
    unstretched = build_noise_schedule(DiffusionConfig(**(qwen | {"shift_terminal": None}))).at_size((16, 128, 128))
    u = torch.linspace(0.05, 0.95, 19)
    assert torch.equal(schedule.at_size((16, 128, 128)).timesteps_at(u), unstretched.timesteps_at(u))


@pytest.mark.parametrize(("side", "steps"), [(16, 4), (64, 28), (64, 50), (96, 50)])
def test_flux2_s_empirical_mu_is_its_pipeline_s_for_the_size_and_the_step_count(side, steps):
    """``resolution_shift_rule=flux2``: our sampler steps through Flux2KleinPipeline's levels (its mu of the latent
    positions and the step count, its grid), and training draws at its mu for 50 steps, whatever the sampler's."""
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    from dit_trainer.diffusion.flow import empirical_mu

    flux2 = FLUX | {"resolution_shift_rule": "flux2", "sample_steps": 7}
    schedule = build_noise_schedule(DiffusionConfig(**flux2)).at_size((128, side, side))
    theirs = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, shift=3.0)
    theirs.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=compute_empirical_mu(side * side, steps))
    torch.testing.assert_close(schedule.sampler(steps, torch.device("cpu")).sigmas, theirs.sigmas, rtol=0, atol=1e-6)
    assert empirical_mu(side * side, steps) == pytest.approx(compute_empirical_mu(side * side, steps), abs=1e-9)
    assert schedule.mu == pytest.approx(compute_empirical_mu(side * side, 50), abs=1e-9)  # training's
