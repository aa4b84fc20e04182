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


@pytest.mark.parametrize(
    ("override", "key", "found", "kind"),
    [("trainer.method=tests.plugins.toy_method:ToyMethod", "trainer.method", "the class ToyMethod",
      "dit_trainer.methods.base.Method"),
     ("model.family=tests.test_registry:TINY_SOURCE", "model.family", "a Source",
      "dit_trainer.components.families.base.Family")],
)  # fmt: skip
def test_an_entry_of_ones_own_of_another_kind_is_refused_naming_the_kind_it_must_be(override, key, found, kind):
    """A method's class instead of its instance, a source where a family belongs, a bare reward function: the
    trainer failed with a traceback where it first used the entry (``'function' object has no attribute
    'models'``), exit 1, after Hydra had made the run folder."""
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", override])
    message = str(caught.value)
    assert f"`{key}` is '{override.partition('=')[2]}', but it is {found}" in message and f"`{kind}`" in message


def test_a_bare_reward_function_is_refused_as_a_gold_reward():
    from dit_trainer.rewards import REWARDS

    with pytest.raises(ConfigError, match=r"but it is a function, and `nft.gold_reward` takes an instance of `dit_"):
        REWARDS.get("tests.plugins.toy_rewards:image_detail", "nft.gold_reward")
