"""The training configuration's schema (``config/schema.py``): the single source of every default."""

import pytest

from ..conftest import CONFIG_DIR, TINY_SHAPES, compose_config, one_paragraph


def test_the_bare_config_is_the_schema_s_defaults():
    """`python train.py` with no overrides runs exactly `TrainConfig()`: the YAML groups it selects by default hold
    no values (interpolations such as `${asset:shapes_vae}` are compared unresolved, as both sides hold them)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dit_trainer.config import TrainConfig

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        composed = compose(config_name="train", overrides=[])
    bare = OmegaConf.to_container(composed, resolve=False)
    bare.pop("hydra", None)
    assert bare == OmegaConf.to_container(OmegaConf.structured(TrainConfig()), resolve=False)


@pytest.mark.parametrize("weight", ["inf", "nan", "0"])
def test_a_mixture_weight_must_be_a_finite_positive_number(weight):
    from dit_trainer.errors import ConfigError

    mixture = f"data.mixture=[{{source:shapes,weight:{weight}}},{{source:shapes}}]"
    with pytest.raises(ConfigError) as caught:
        compose_config([*TINY_SHAPES, mixture])
    assert "it must be a finite number > 0" in one_paragraph(caught.value, "data.mixture[0].weight")
