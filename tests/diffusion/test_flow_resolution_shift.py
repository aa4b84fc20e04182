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
