"""A training method of the user's own, in a module outside the package (tests/plugins/toy_method.py), named by
import path in ``trainer.method``: it trains, its state is checkpointed, and a resumed run continues exactly as the
uninterrupted one; its own check refuses what it cannot train, and an unknown method is one paragraph."""

import math

import pytest
from safetensors.torch import load_file

from ..conftest import QUIET, REPO, TINY_SHAPES, read_metrics, run_here

pytestmark = pytest.mark.slow  # three train.py runs

PLUGINS = REPO / "tests" / "plugins"
TOY = [*TINY_SHAPES, *QUIET, "trainer.method=toy_method:TOY_METHOD", "trainer.checkpoint_every=2"]
WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


def train(run_dir, *overrides: str) -> None:
    result = run_here(["train.py", *TOY, f"hydra.run.dir={run_dir}", *overrides])
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_method_from_outside_the_package_trains_checkpoints_and_resumes_exactly(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))  # as PYTHONPATH=tests/plugins does for a user's command
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train(whole, "trainer.max_steps=4")
    metrics = read_metrics(whole)
    assert [record["toy/images_seen"] for record in metrics] == [16.0, 32.0, 48.0, 64.0]
    assert all(math.isfinite(record["loss"]) and record["grad_norm"] > 0 for record in metrics)
    assert (whole / "checkpoints" / "checkpoint-2" / "toy_images_seen.json").read_text() == '{"count": 32}'
    start, end = (load_file(whole / "checkpoints" / f"checkpoint-{step}" / WEIGHTS) for step in (2, 4))
    assert all(not start[name].equal(end[name]) for name in start)  # the DiT trained

    train(cut, "trainer.max_steps=2")
    train(cut, "trainer.max_steps=4", "trainer.resume=latest")
    assert [strip_timing(record) for record in read_metrics(cut)] == [strip_timing(record) for record in metrics]


def strip_timing(record: dict) -> dict:
    """A record without the values that measure time, which no two runs share."""
    return {key: value for key, value in record.items() if "per_sec" not in key and "seconds" not in key}


def test_a_method_refuses_what_it_cannot_train_and_an_unknown_method_is_one_paragraph(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    run_dir = tmp_path / "run"
    own_check = run_here(["train.py", *TOY, "trainer.gradient_accumulation_steps=2", f"hydra.run.dir={run_dir}"])
    assert own_check.returncode == 2 and "Traceback" not in own_check.stderr
    assert "the toy method takes one batch per update" in own_check.stderr
    unknown = run_here(["train.py", *TINY_SHAPES, "trainer.method=dpo", f"hydra.run.dir={run_dir}"])
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert "`trainer.method` is 'dpo'" in unknown.stderr and "sft, grpo" in unknown.stderr
    assert not run_dir.exists()  # refused before anything was written
