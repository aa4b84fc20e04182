"""The conventions of the tools users know (issue 39): ``python train.py`` logs the start banner, a line per log step
and the closing summary into Hydra's ``train.log``, prints the summary once and leaves ``summary.json``;
``accelerate launch --mixed_precision bf16`` is followed by ``trainer.mixed_precision=auto`` and named at the start."""

from __future__ import annotations

import json
import logging

import pytest
from accelerate.state import AcceleratorState, GradientState, PartialState

from ..conftest import QUIET, TINY_SHAPES, read_metrics, run_script
from ..training.test_launch import launched_env
from .family_runs import train_in_process

SHORT = ("data.length=32", "trainer.batch_size=8", "conditioner.memo_size=64", "trainer.max_steps=2", *QUIET)


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory):
    """``python train.py`` on the CPU: 2 steps in fp32 (``auto`` without a launcher), a log line each."""
    run_dir = tmp_path_factory.mktemp("conventions") / "run"
    result = run_script(["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *SHORT])
    assert result.returncode == 0, result.stderr[-4000:]
    return run_dir, result


@pytest.mark.slow
def test_train_log_holds_the_banner_the_loss_lines_and_the_summary(fp32_run):
    run_dir, result = fp32_run
    log = (run_dir / "train.log").read_text()
    assert log.count("Starting the run:") == 1 and f"Run folder   {run_dir.resolve()}" in log
    assert "Precision    fp32 (auto: no CUDA GPU" in log or "Precision    bf16 (auto: this GPU" in log
    assert "step 1/2: loss " in log and "step 2/2: loss " in log  # in the file, not between the progress bars
    assert "step 1/2: loss " not in result.stdout
    [closing] = [line for line in log.splitlines() if "Trained 2 steps in " in line]
    assert result.stdout.count("Trained 2 steps in ") == 1 and closing.endswith(f"Run folder: {run_dir} (summary.json)")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_loss"] == read_metrics(run_dir)[-1]["loss"]


@pytest.mark.slow
def test_the_launchers_bf16_changes_the_losses_and_is_logged(fp32_run, tmp_path, monkeypatch, caplog):
    """The same 2 steps as ``fp32_run`` (bit-identical in this process without a launcher's precision) under the
    environment ``accelerate launch --mixed_precision bf16`` gives its process."""
    for state in (AcceleratorState, GradientState, PartialState):  # no state left from another test's precision
        state._reset_state(*([True] if state is AcceleratorState else []))
    for name, value in launched_env("--num_processes", "1", "--mixed_precision", "bf16").items():
        if name.startswith("ACCELERATE_"):
            monkeypatch.setenv(name, value)
    with caplog.at_level(logging.INFO, logger="dit_trainer"):
        bf16 = read_metrics(train_in_process(tmp_path / "bf16", *SHORT))
    fp32 = read_metrics(fp32_run[0])
    assert [r["step"] for r in bf16] == [r["step"] for r in fp32] == [1, 2]
    assert all(a["loss"] != b["loss"] for a, b in zip(fp32, bf16))
    [banner] = [r.getMessage() for r in caplog.records if "Starting the run:" in r.getMessage()]
    assert "Precision    bf16 (auto: the launcher's --mixed_precision bf16" in banner
