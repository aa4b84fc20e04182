"""Resuming ``train.py`` runs: from a checkpoint it reproduces the uninterrupted run, ``trainer.resume=latest``
continues in the same run folder, and a run preempted by SIGTERM checkpoints, exits 3 and resumes exactly."""

import os
import signal
import subprocess
import sys

import psutil
import pytest

from dit_trainer.data.sources.shapes import write_shapes_folder
from dit_trainer.errors import EXIT_PREEMPTED
from dit_trainer.runs.run_folder import list_checkpoints

from ..conftest import (
    CPU_PROCESSES,
    QUIET,
    REPO,
    TINY_SHAPES,
    accelerate_launch,
    read_metrics,
    start_training,
    train_here,
    wait_for,
)
from ..data.files import CANVASES, bucketed


@pytest.mark.slow
def test_resume_latest_continues_in_the_same_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    common = ("trainer.log_every=1", "trainer.checkpoint_every=10", "trainer.sample_every=0")
    train_here(run_dir, "trainer.max_steps=10", *common)
    result = train_here(run_dir, "trainer.max_steps=15", "trainer.resume=latest", *common)
    assert "Trained 15 steps" in result.stdout
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, 16))


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_exits_3_and_resume_matches_the_uninterrupted_run(tmp_path):
    """The stop skips the monitors due at its step (sample grids every step here): the grace period before the
    kill is for the checkpoint."""
    train_here(tmp_path / "straight", "trainer.max_steps=30", *QUIET)
    run_dir = tmp_path / "preempted"
    process = start_training(run_dir, "trainer.max_steps=30", "trainer.checkpoint_every=0", "trainer.sample_every=1")
    wait_for(lambda: len(read_metrics(run_dir)) >= 3, process)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == EXIT_PREEMPTED, stderr[-3000:]
    stopped = len(read_metrics(run_dir))
    assert 3 <= stopped < 30 and "Preempted at step" in stdout
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == [f"checkpoint-{stopped}"]
    grids = sorted(p.name for p in (run_dir / "samples").iterdir())
    assert grids == [f"step_{step:07d}.png" for step in range(1, stopped)]

    train_here(run_dir, "trainer.max_steps=30", "trainer.resume=latest", *QUIET)
    straight = [r["loss"] for r in read_metrics(tmp_path / "straight")]
    assert [r["loss"] for r in read_metrics(run_dir)] == straight  # bit for bit


def deterministic(record: dict) -> dict:
    """A metrics record without its timings."""
    return {key: value for key, value in record.items() if "seconds" not in key and "per_sec" not in key}


@pytest.mark.slow
def test_resume_is_bit_exact_with_buckets_validation_and_the_reward_monitor(tmp_path):
    """Every logged value after the resume (losses, per-bucket losses, val/loss, rewards) equals the uninterrupted
    run's, bit for bit, with the data in aspect-ratio buckets, randomly cropped and flipped by two data-loader
    workers, validation holding images out and the reward monitor sampling (each at step 10, the checkpoint's step,
    and at the end)."""
    folder = write_shapes_folder(tmp_path / "images", 64, CANVASES)
    augmented = ("data.crop=random", "data.horizontal_flip=true", "data.num_workers=2")
    common = (*bucketed(folder), *augmented, "trainer.log_every=1", "trainer.checkpoint_every=10",
              "trainer.sample_every=0", "validation.every_n_steps=10", "validation.split=0.125",
              "monitor.reward.enabled=true", "monitor.reward.every_n_steps=10", "monitor.reward.prompt_file=null",
              "monitor.reward.prompts=[a red circle,a blue square]", "monitor.reward.group_size=2")  # fmt: skip
    train_here(tmp_path / "straight", "trainer.max_steps=20", *common)
    checkpoint = tmp_path / "straight" / "checkpoints" / "checkpoint-10"
    train_here(tmp_path / "resumed", "trainer.max_steps=20", *common, f"trainer.resume={checkpoint}")
    straight = [deterministic(r) for r in read_metrics(tmp_path / "straight")]
    resumed = [deterministic(r) for r in read_metrics(tmp_path / "resumed")]
    assert [r["step"] for r in resumed] == list(range(11, 21))
    assert {"val/loss", "reward/mean"} <= set(resumed[-1]) and any(key.startswith("loss/") for key in resumed[0])
    assert resumed == straight[10:]


@pytest.mark.slow
def test_a_run_killed_right_after_a_checkpoint_keeps_that_steps_metrics(tmp_path):
    """A step's metrics (and its monitors') are logged before its checkpoint is written: a kill just after the
    checkpoint completes loses none, and the resumed run's metrics.jsonl has every step once."""
    die_after_step_10 = (
        "import os\nfrom dit_trainer.training.state.checkpoint import Checkpointer\nsave = Checkpointer.save\n"
        "def save_then_die(self, step):\n    save(self, step)\n    if step == 10:\n        os._exit(9)\n"
        "Checkpointer.save = save_then_die"
    )
    run_dir = tmp_path / "run"
    process = start_training(run_dir, "trainer.max_steps=20", "trainer.checkpoint_every=10", code=die_after_step_10)
    process.communicate(timeout=240)
    assert process.returncode == 9 and read_metrics(run_dir)[-1]["step"] == 10
    train_here(run_dir, "trainer.max_steps=20", "trainer.checkpoint_every=10", "trainer.resume=latest", *QUIET)
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, 21))


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """Two processes: only rank 1 gets SIGUSR1 (a node's warning), and the flag travels in the step's one collective
    (the non-finite check's), so both stop after the same step and write one checkpoint together."""
    run_dir = tmp_path / "run"
    argv = [*accelerate_launch(2), "train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *QUIET,
            "trainer.max_steps=30", "trainer.checkpoint_every=0"]  # fmt: skip
    process = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=os.environ | CPU_PROCESSES, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    wait_for(lambda: len(read_metrics(run_dir)) >= 3, process)
    ranks = [child for child in psutil.Process(process.pid).children(recursive=True) if "train.py" in child.cmdline()]
    rank_1 = next(child for child in ranks if child.environ().get("RANK") == "1")
    rank_1.send_signal(signal.SIGUSR1)
    stdout, stderr = process.communicate(timeout=240)
    stopped = len(read_metrics(run_dir))
    assert 3 <= stopped < 30, stderr[-3000:]
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == [f"checkpoint-{stopped}"]
    assert f"Stopped by another process's signal at step {stopped}" in stdout + stderr  # rank 0 got none
