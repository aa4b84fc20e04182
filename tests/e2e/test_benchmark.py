"""scripts/benchmark.py: one command, four measurements, a table and benchmark.json (speed targets are measured
by running it, not asserted here: timings on a shared 2-core machine are noise)."""

import json

import pytest

from ..conftest import run_here

pytestmark = pytest.mark.slow  # every test here trains or launches processes

KEYS = ("bare_step_img_s", "trainer_cached_img_s", "trainer_uncached_img_s", "reference_img_s", "peak_rss_mb",
        "train_flops_per_image")  # fmt: skip


def test_benchmark_prints_the_table_and_writes_benchmark_json(tmp_path):
    tiny = ["+experiment=shapes", "data.length=48", "trainer.batch_size=16", "model.num_layers=2"]
    result = run_here(["scripts/benchmark.py", "--steps", "2", "--warmup", "1", "--out", str(tmp_path), *tiny])
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "benchmark.json").read_text())
    assert all(report[key] > 0 for key in KEYS)
    # forward + backward costs about three forwards; FlopCounterMode counts the matmuls of both
    assert 2.5 < report["train_flops_per_image"] / report["forward_flops_per_image"] < 3.5
    for label in ("(a) bare DiT step", "(b) trainer, cache", "(c) trainer, encode every batch", "(d) reference loop"):
        assert label in result.stdout
    assert (tmp_path / "cache" / "index.json").is_file()
    assert report["batch_plan_seconds_per_batch"] > 0 and "buckets and mixtures (the batch plan)" in result.stdout
