"""Registries (``registry.py``): an unknown name is refused listing its registry, at validation and by the builders,
and a name of one's own is an import path."""

import pytest
import torch

from dit_trainer.data.sources.shapes import ShapesDataset
from dit_trainer.data.sources.source import Source, build_dataset
from dit_trainer.errors import ConfigError

from .conftest import compose_config


@pytest.mark.parametrize(
    ("override", "key", "registry"),
    [("data.source=laion", "data.source", "dit_trainer.data:SOURCES"),
     ("vae.kind=vqgan", "vae.kind", "dit_trainer.components:VAE_KINDS"),
     ("conditioner.kind=gemma", "conditioner.kind", "dit_trainer.components:CONDITIONER_KINDS"),
     ("diffusion.objective=x0", "diffusion.objective", "dit_trainer.diffusion:OBJECTIVES"),
     ("diffusion.sampler=heun", "diffusion.sampler", "dit_trainer.diffusion:SAMPLERS"),
     ("+reward.weights.aesthetic=1", "reward.weights.aesthetic", "dit_trainer.rewards:REWARDS")],
)  # fmt: skip
def test_an_unknown_name_is_refused_listing_its_registry(override, key, registry):
    import importlib

    module, name = registry.split(":")
    accepted = ", ".join(getattr(importlib.import_module(module), name))
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", override])
    assert f"`{key}`" in str(caught.value) and accepted in str(caught.value)


def test_builders_refuse_an_unknown_name_instead_of_falling_back():
    from dit_trainer.config import DataConfig, RewardConfig
    from dit_trainer.rewards.build import build_reward

    with pytest.raises(ConfigError, match="`data.source` is 'laion'"):
        build_dataset(DataConfig(source="laion"))
    with pytest.raises(ConfigError, match="`reward.weights.aesthetic`"):
        build_reward(RewardConfig(weights={"aesthetic": 1.0}), torch.device("cpu"))


BUILT: list[str] = []
TINY_SOURCE = Source(lambda cfg: BUILT.append(cfg.path) or ShapesDataset(4, 32), "a folder", "/x")


def test_a_source_of_ones_own_is_named_by_its_import_path(tmp_path):
    """A data source outside the package is ``data.source=package.module:SOURCE``: validation and building both
    read it, and its own path rule applies."""
    with pytest.raises(ConfigError, match="`data=tests.test_registry:TINY_SOURCE` needs a folder"):
        compose_config(["+experiment=shapes", "data.source=tests.test_registry:TINY_SOURCE"])
    cfg = compose_config(["+experiment=shapes", "data.source=tests.test_registry:TINY_SOURCE", f"data.path={tmp_path}"])
    assert len(build_dataset(cfg.data)) == 4 and [str(tmp_path)] == BUILT
