"""The training run's checks (``training/checks.py``): DP-SGD combinations that would void its guarantee or fail
inside Opacus, and an FID monitor without validation images, are refused naming the key."""

import pytest

from dit_trainer.errors import ConfigError

from ..conftest import TINY_SHAPES, compose_config


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.gradient_accumulation_steps=2", "trainer.gradient_accumulation_steps"),
        ("trainer.gradient_checkpointing=true", "trainer.gradient_checkpointing"),
        ("trainer.mixed_precision=fp16", "trainer.mixed_precision"),
        ("trainer.compile=true", "trainer.compile"),
        ("privacy.noise_multiplier=1.0", "privacy.noise_multiplier/target_epsilon"),  # both set
        ("privacy.target_epsilon=null", "privacy.noise_multiplier/target_epsilon"),  # neither
        ("privacy.mode=exact", "privacy.mode"),
    ],
)
def test_refused_combinations_name_the_key(override, key):
    with pytest.raises(ConfigError, match=f"`{key}`.*To fix it"):
        compose_config(["+experiment=shapes_dp", override])


@pytest.mark.parametrize("option", ["trainer.gradient_checkpointing_every=2", "trainer.reentrant_checkpointing=true"])
def test_how_blocks_are_recomputed_needs_checkpointing_on(option):
    """Alone, each recomputed nothing and said nothing (the README's selective checkpointing read as its own key)."""
    key = option.split("=")[0]
    with pytest.raises(ConfigError, match=f"`{key}`.*`trainer.gradient_checkpointing` is false.*To fix it, add "):
        compose_config([*TINY_SHAPES, option])
    assert compose_config([*TINY_SHAPES, option, "trainer.gradient_checkpointing=true"])


def test_the_fid_monitor_needs_validation():
    with pytest.raises(ConfigError, match="`monitor.fid.enabled`"):
        compose_config([*TINY_SHAPES, "validation.every_n_steps=0", "monitor.fid.enabled=true"])


def test_the_fid_monitor_is_refused_with_the_config_when_its_features_cannot_be_extracted(monkeypatch):
    """Without torch-fidelity the Inception features would fail once the models are built, naming `fid_features`,
    a key of evaluate.py that train.py does not have."""
    import torchmetrics.utilities.imports as imports

    monkeypatch.setattr(imports, "_TORCH_FIDELITY_AVAILABLE", False)
    fid = ["validation.every_n_steps=10", "validation.split=0.1", "monitor.fid.enabled=true"]
    with pytest.raises(ConfigError, match=r"`monitor\.fid\.features` is 'inception'.*torch-fidelity"):
        compose_config([*TINY_SHAPES, *fid])
    compose_config([*TINY_SHAPES, *fid, "monitor.fid.features=vae"])
