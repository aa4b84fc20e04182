"""Every model of a run built from its config (``components/build.py``): the resolution is checked again once the
VAE's factor is known."""

import pytest
import torch

from dit_trainer.errors import ConfigError

from ..conftest import TINY_SHAPES, compose_config, one_paragraph


def test_a_resolution_is_checked_again_once_the_vae_is_loaded():
    """A VAE named by a hub id that is not on this machine yet has an unknown factor until it loads."""
    from dit_trainer.components.build import build_components

    cfg = compose_config(TINY_SHAPES)
    cfg.data.resolution = 33  # as if validation could not know the VAE's factor
    with pytest.raises(ConfigError) as caught:
        build_components(cfg, torch.device("cpu"), torch.float32)
    assert "2 × 4 = 8" in one_paragraph(caught.value, "data.resolution")
