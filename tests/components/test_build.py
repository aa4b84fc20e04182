"""Every model of a run built from its config (``components/build.py``): the resolution is checked again once the
VAE's factor is known."""

import pytest
import torch

from dit_trainer.errors import ConfigError, ModelLoadError

from ..conftest import TINY_SHAPES, components_of, compose_config, one_paragraph


def test_a_resolution_is_checked_again_once_the_vae_is_loaded():
    """A VAE named by a hub id that is not on this machine yet has an unknown factor until it loads."""

    cfg = compose_config(TINY_SHAPES)
    cfg.data.resolution = 33  # as if validation could not know the VAE's factor
    with pytest.raises(ConfigError) as caught:
        components_of(cfg)
    assert "2 × 4 = 8" in one_paragraph(caught.value, "data.resolution")


def test_a_grpo_run_reads_the_weights_it_starts_from_from_safetensors_only(tmp_path, monkeypatch):
    """They are a checkpoint's (or the run's own copy of them): a pickle there was planted, and is not unpickled
    (diffusers would otherwise fall back to reading a lone `.bin` with `torch.load`)."""
    import dataclasses

    from dit_trainer.components.build import trained_start

    from ..conftest import SHAPES_TRANSFORMER, build_tiny_transformer

    start = tmp_path / "transformer_ema"
    build_tiny_transformer(**SHAPES_TRANSFORMER).transformer.save_pretrained(start, safe_serialization=False)
    cfg = compose_config(TINY_SHAPES)
    cfg = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, pretrained=str(start)),
        trainer=dataclasses.replace(cfg.trainer, init_weights=str(start)),
    )
    assert trained_start(cfg.model, cfg.trainer) == start
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: pytest.fail("a pickle was loaded"))
    with pytest.raises(ModelLoadError, match="Could not read the weights in .*safetensors"):
        components_of(cfg)
