"""The ``diffusion`` section's checks (``diffusion/checks.py``): settings that do not fit the objective are refused,
naming the key."""

import pytest

from dit_trainer.errors import ConfigError

from ..conftest import TINY_SHAPES, compose_config


@pytest.mark.parametrize(
    ("overrides", "key"),
    [(["diffusion=flow", "diffusion.objective=flow_matching", "diffusion.sampler=ddim"], "diffusion.sampler"),
     (["diffusion=flow", "diffusion.objective=flow_matching", "diffusion.snr_gamma=5"], "diffusion.snr_gamma"),
     (["diffusion.flow_weighting=cosmap"], "diffusion.flow_weighting"),
     (["diffusion.timestep_sampling=beta"], "diffusion.timestep_sampling")],
)  # fmt: skip
def test_settings_that_do_not_fit_the_objective_are_refused(overrides, key):
    with pytest.raises(ConfigError, match=f"`{key}`"):
        compose_config([*TINY_SHAPES, *overrides])
