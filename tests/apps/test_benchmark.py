"""The benchmark's reference loop (``apps/benchmark.py``): diffusers' plain training loop through the run's own VAE
and family calls, so that it runs for every VAE kind (it read the raw autoencoder: pixel space, FLUX.2's and the
video VAEs failed after every other measurement, and the report was lost)."""

import pytest
import torch

from dit_trainer.apps.benchmark import reference_step

from ..conftest import TINY_SHAPES, components_of, compose_config


@pytest.mark.parametrize("vae", ["shapes", "pixel"])
def test_the_reference_loop_trains_through_the_runs_vae(vae):
    cfg = compose_config([*TINY_SHAPES, f"vae={vae}", "data.length=16", "trainer.batch_size=4", "data.num_workers=0"])
    torch.manual_seed(0)
    parts = components_of(cfg)
    before = [parameter.detach().clone() for parameter in parts.dit.transformer.parameters()]
    step = reference_step(cfg, parts, torch.device("cpu"))
    step()
    after = list(parts.dit.transformer.parameters())
    assert all(map(torch.equal, before, after))  # it trains a copy
