"""A family, a data source and a reward of the user's own, in a module outside the package (tests/plugins), named
by import path: train.py trains with them and scripts/sample.py samples the run, with no package file edited."""

import math

import pytest
from safetensors.torch import load_file

from ..conftest import REPO, read_metrics, run_here

pytestmark = pytest.mark.slow  # launches train.py and sample.py

PLUGINS = REPO / "tests" / "plugins"
TOY = [
    "+experiment=shapes",
    "model.family=toy_extension:TOY_FAMILY",
    "data.source=toy_extension:TOY_SOURCE",
    "reward=none",
    r"+reward.weights={toy_extension\:TOY_REWARD:1.0}",
    "data.length=64",
    "trainer.batch_size=16",
    "trainer.max_steps=3",
    "trainer.log_every=1",
    "trainer.checkpoint_every=1",
    "trainer.sample_prompts=[a red image]",
    "monitor.reward.every_n_steps=3",
    "monitor.reward.prompts=[a red image,a white image]",
    "monitor.reward.prompt_file=null",
    "monitor.reward.group_size=2",
    "diffusion.sample_steps=2",
    "validation.every_n_steps=0",
]


def test_a_family_source_and_reward_from_outside_the_package_train_and_sample(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))  # as PYTHONPATH=tests/plugins does for a user's command
    run_dir = tmp_path / "run"
    result = run_here(["train.py", *TOY, f"hydra.run.dir={run_dir}"])
    assert result.returncode == 0, result.stderr[-3000:]

    metrics = read_metrics(run_dir)
    assert [record["step"] for record in metrics] == [1, 2, 3]
    assert all(math.isfinite(record["loss"]) and record["grad_norm"] > 0 for record in metrics)
    assert 0 < metrics[-1]["reward/toy_extension:TOY_REWARD"] < 1  # the toy reward scored the monitor's samples
    first, last = (
        load_file(
            run_dir / "checkpoints" / f"checkpoint-{step}" / "transformer" / "diffusion_pytorch_model.safetensors"
        )
        for step in (1, 3)
    )
    assert set(first) == {
        f"{layer}.{kind}" for layer in ("proj_in", "time", "text", "proj_out") for kind in ("weight", "bias")
    }
    assert all(not first[name].equal(last[name]) for name in first)  # every toy parameter trained

    out_dir = tmp_path / "samples"
    sampled = run_here(
        ["scripts/sample.py", str(run_dir), "prompts=[a red image]", "images_per_prompt=2", f"out_dir={out_dir}"]
    )
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert sorted(path.name for path in out_dir.iterdir()) == ["00000.png", "00001.png", "index.jsonl"]


def test_an_import_path_that_does_not_import_is_one_paragraph(tmp_path):
    result = run_here(["train.py", *TOY[:1], "model.family=no_such_module:FAMILY", f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "`model.family` is 'no_such_module:FAMILY'" in result.stderr and "PYTHONPATH" in result.stderr
