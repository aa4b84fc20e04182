"""A mixed-aspect image folder through ``train.py`` with aspect-ratio buckets, and ``scripts/sample.py`` at a
non-square size."""

import json

import pytest
from PIL import Image

from dit_trainer.data.sources.shapes import write_shapes_folder

from ..conftest import run_here, train_here
from ..data.files import CANVASES, bucketed


@pytest.mark.slow
def test_a_mixed_aspect_folder_trains_with_buckets_and_samples_non_square_images(tmp_path):
    write_shapes_folder(tmp_path / "images", 48, CANVASES)
    run = tmp_path / "run"
    train_here(run, *bucketed(tmp_path / "images"), "trainer.max_steps=6", "trainer.sample_every=0",
               "trainer.log_every=2", "data.cache_latents=true")  # fmt: skip
    assert (run / "checkpoints").is_dir() and len(list((run / "image_sizes").glob("*.json"))) == 1  # the run's own
    out = tmp_path / "samples"
    result = run_here(["scripts/sample.py", f"run_dir={run}", "prompts=[a red circle]", "images_per_prompt=2",
                       "height=24", "width=40", f"out_dir={out}", "steps=2"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert [Image.open(out / row["file"]).size for row in rows] == [(40, 24), (40, 24)]
    refused = run_here(["scripts/sample.py", f"run_dir={run}", "prompts=[a red circle]", "height=20",
                        f"out_dir={tmp_path / 'refused'}"])  # fmt: skip
    assert refused.returncode != 0 and "`height`" in refused.stderr and "height=16" in refused.stderr
