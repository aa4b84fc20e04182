"""The ``shapes_grpo_fast`` recipe through the loader ``train.py`` uses: it composes and validates as Flow-GRPO-Fast's
schedule on the shapes run's v-prediction (DDIM-eta) policy, and the loader refuses the CPS step on that model."""

import pytest

from dit_trainer.errors import ConfigError

from ..conftest import compose_config, one_paragraph

# What a shapes run's config.yaml gives `trainer.init_from` (here: a model named instead, and its objective).
START = ["model.pretrained=PixArt-alpha/PixArt-XL-2-256x256", "diffusion.objective=v_prediction"]


def test_shapes_grpo_fast_is_a_random_two_step_window_within_the_first_five(online):
    """Noise in 2 steps placed at random within the first 5 of 10, the steps before them once per caption; CFG as
    the run samples (the shapes model needs it), DDIM-eta's step (the only one a v-prediction model has)."""
    cfg = compose_config(["+experiment=shapes_grpo_fast", *START])
    g = cfg.grpo
    assert (cfg.trainer.method, g.sde_window, g.sde_steps, g.window_range, g.sample_steps) == (
        "grpo",
        "random",
        2,
        5,
        10,
    )
    assert g.shared_prefix and g.sde_type == "sde" and g.guidance_scale is None


def test_the_loader_refuses_cps_on_a_v_prediction_model(online):
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes_grpo_fast", *START, "grpo.sde_type=cps"])
    assert "set `grpo.sde_type=sde`" in one_paragraph(caught.value, "grpo.sde_type")
