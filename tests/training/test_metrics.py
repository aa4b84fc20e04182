"""``metrics.jsonl`` and what goes into it (``training/metrics.py``): losses averaged over processes and per
timestep bucket, and a file that a resumed run cuts back to its checkpoint's step."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from dit_trainer.training.metrics import MetricsFile, TimestepLossBuckets

REPO = Path(__file__).resolve().parents[2]  # not from conftest: this file also runs as a torch.distributed worker


def test_timestep_buckets_average_the_loss_per_tenth_of_the_schedule():
    buckets = TimestepLossBuckets(1000, {}, torch.device("cpu"))
    buckets.add(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([5, 99, 950]))
    buckets.add(torch.tensor([7.0]), torch.tensor([1000.0]))  # flow matching's sigma = 1
    assert buckets.collect(Accelerator(cpu=True)) == {"loss/t_0-99": 2.0, "loss/t_900-999": 6.0}
    assert buckets.collect(Accelerator(cpu=True)) == {}


def test_a_resumed_run_drops_the_lines_logged_after_its_checkpoint(tmp_path):
    metrics = MetricsFile(tmp_path / "metrics.jsonl")
    for step in (5, 10, 15):
        metrics.write({"step": step, "loss": step / 10})
    metrics.truncate_after(10)
    assert [record["step"] for record in metrics.read()] == [5, 10]
    metrics.write({"step": 15, "loss": 0.0})
    assert [json.loads(line)["step"] for line in metrics.path.read_text().splitlines()] == [5, 10, 15]


def mean_worker() -> None:
    """One CPU rank: rank r logged losses [r, r + 2]; every rank must report the mean over both ranks."""
    import torch
    from accelerate import Accelerator

    from dit_trainer.training.metrics import mean_over_processes

    accelerator = Accelerator(cpu=True)
    rank = float(accelerator.process_index)
    mean = mean_over_processes(accelerator, torch.tensor([rank, rank + 2]))
    print(f"rank {accelerator.process_index}: mean {mean}", flush=True)
    accelerator.end_training()


@pytest.mark.slow
def test_logged_losses_are_the_mean_over_processes():
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
         "--mean-worker"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # the two ranks' lines may interleave on stdout
    assert sorted(re.findall(r"rank (\d): mean ([\d.]+)", result.stdout)) == [("0", "1.5"), ("1", "1.5")]


if __name__ == "__main__" and sys.argv[1:2] == ["--mean-worker"]:
    mean_worker()


def test_a_torn_last_line_is_skipped_and_the_next_resume_rewrites_a_clean_file(tmp_path):
    metrics = MetricsFile(tmp_path / "metrics.jsonl")
    for step in (5, 10):
        metrics.write({"step": step, "loss": 1.0})
    with metrics.path.open("a") as file:
        file.write('{"step": 15, "lo')  # a kill in the middle of a write
    assert [record["step"] for record in metrics.read()] == [5, 10]
    metrics.truncate_after(10)
    metrics.write({"step": 15, "loss": 0.5})
    assert [json.loads(line)["step"] for line in metrics.path.read_text().splitlines()] == [5, 10, 15]


def test_a_resume_rewrite_that_fails_keeps_the_whole_history(small_disk):
    metrics = MetricsFile(small_disk(64 * 1024) / "metrics.jsonl")
    for step in range(1, 201):
        metrics.write({"step": step, "loss": 1.0, "note": "x" * 200})  # ~45 kB of history
    history = metrics.path.read_bytes()
    with pytest.raises(OSError):  # the disk cannot hold a second copy
        metrics.truncate_after(150)
    assert metrics.path.read_bytes() == history
    assert sorted(p.name for p in metrics.path.parent.iterdir()) == ["metrics.jsonl"]  # no temporary left
