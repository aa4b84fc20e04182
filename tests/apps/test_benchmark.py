"""The benchmark's reference loop (``apps/benchmark.py``): diffusers' plain training loop through the run's own VAE
and family calls, so that it runs for every VAE kind (it read the raw autoencoder: pixel space, FLUX.2's and the
video VAEs failed after every other measurement, and the report was lost); and its folder, checked first."""

import pytest
import torch

from dit_trainer.apps.benchmark import check_out_dir, reference_step
from dit_trainer.errors import ConfigError

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


def test_the_benchmark_folder_is_checked_before_anything_is_measured(tmp_path):
    """A file as `--out` ended in FileExistsError's traceback after the precompute; a second benchmark into one
    folder replaced the first one's report without a word."""
    (tmp_path / "prompts.txt").write_text("the user's")
    with pytest.raises(ConfigError, match="`--out` is .*prompts.txt', but it is a file"):
        check_out_dir(tmp_path / "prompts.txt", "benchmark.json")
    (tmp_path / "benchmark.json").write_text("{}")
    with pytest.raises(ConfigError, match="it holds the benchmark.json of an earlier benchmark"):
        check_out_dir(tmp_path, "benchmark.json")
    check_out_dir(tmp_path, "loader.json")  # the other measure's report may stand beside it
