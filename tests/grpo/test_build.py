"""A GRPO run's parts (``grpo/build.py``): the policy draws noise only in the configured window of steps."""

import dataclasses
import warnings

import pytest
import torch

from dit_trainer.config import DiffusionConfig, TrainConfig
from dit_trainer.diffusion.build import build_noise_schedule
from dit_trainer.grpo.build import build_policy

from .conftest import CPU, FLOW


@pytest.mark.parametrize("family", ["ddim", "flow"])
def test_build_policy_draws_noise_only_in_the_configured_window(family):
    """``grpo.sde_start`` / ``sde_steps`` pick the stochastic (trained) steps; without ``sde_steps`` every step from
    ``sde_start`` but the last."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        schedule = build_noise_schedule(DiffusionConfig(**FLOW) if family == "flow" else DiffusionConfig())

    def stochastic(**grpo) -> list[int]:
        cfg = TrainConfig()
        cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, sample_steps=10, **grpo))
        policy = build_policy(cfg.grpo, schedule, CPU)
        assert policy.num_steps == 10
        return torch.nonzero(policy.stochastic).flatten().tolist()

    assert stochastic(sde_start=2, sde_steps=3) == [2, 3, 4]
    assert stochastic(sde_start=0, sde_steps=None) == list(range(9))
    assert stochastic(sde_start=2, sde_steps=None) == list(range(2, 9))
    assert stochastic(sde_start=8, sde_steps=1) == [8]
