"""The DP recipe (``+experiment=shapes_dp``) through ``train.py``: the loss falls, epsilon stays within its target."""

import json

import pytest

from ..conftest import TINY_SHAPES, run_here


@pytest.mark.slow
def test_shapes_dp_trains(tmp_path):
    tiny = [o for o in TINY_SHAPES if not o.startswith("+experiment=")]
    overrides = ["trainer.max_steps=40", "trainer.log_every=10", "trainer.checkpoint_every=0", "optim.warmup_steps=0"]
    result = run_here(["train.py", "+experiment=shapes_dp", *tiny, *overrides, f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert records[-1]["loss"] < 0.95 * records[0]["loss"], [r["loss"] for r in records]
    epsilons = [r["privacy/epsilon"] for r in records]
    assert epsilons == sorted(epsilons) and 0 < epsilons[-1] <= 8.0 + 0.1  # the experiment's target
