"""Throughput rows of the GPU check, run in-process on the CPU as their subprocess runs them on a GPU: the trainer's
step (or an online method's epoch) of the tiny recipe timed at each batch size, each batch size's trainer closed when
its measurement ends (its run folder's lock given back), so that a sweep does not pile up locked folders and
heartbeat threads."""

import pytest

from dit_trainer.apps.gpu_check.assets import write_assets
from dit_trainer.apps.gpu_check.throughput import Job, run_jobs
from dit_trainer.runs.run_lock import LOCK
from tests.conftest import REPO

ROWS = [  # the CPU plan's sizes
    ("trainer", (2, 4), ["run-pixart_xl_2-eager-2", "run-pixart_xl_2-eager-4"]),
    ("grpo", (4,), ["run-pixart_xl_2-tiny-grpo-4"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("what", "batches", "runs"), ROWS)
def test_a_row_times_each_batch_size_and_gives_each_run_folder_back(tmp_path, what, batches, runs):
    job = Job("pixart_xl_2", what, "eager", batches, tiny=True, warmup=1, steps=2)
    [result] = run_jobs([job], REPO / "configs", write_assets(tmp_path / "assets"), tmp_path)
    assert result["status"] == "ok", result.get("error")
    assert [(row["batch"], row["status"]) for row in result["batches"]] == [(batch, "ok") for batch in batches]
    assert all(row["img_s"] > 0 for row in result["batches"])
    run_dirs = sorted(tmp_path.glob("run-*"))
    assert [folder.name for folder in run_dirs] == runs
    assert not [folder for folder in run_dirs if (folder / LOCK).exists()]  # each trainer closed
