"""Resuming ``train.py`` runs: from a checkpoint it reproduces the uninterrupted run, ``trainer.resume=latest``
continues in the same run folder, and a run preempted by SIGTERM checkpoints, exits 3 and resumes exactly."""

import signal

import pytest

from dit_trainer.errors import EXIT_PREEMPTED
from dit_trainer.run_folder import list_checkpoints

from ..conftest import QUIET, read_metrics, start_training, train, wait_for


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    common = ("trainer.log_every=1", "trainer.checkpoint_every=20", "trainer.sample_every=0")
    train(tmp_path / "straight", "trainer.max_steps=40", *common)
    train(
        tmp_path / "resumed",
        "trainer.max_steps=40",
        *common,
        f"trainer.resume={tmp_path / 'straight' / 'checkpoints' / 'checkpoint-20'}",
    )
    straight = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "straight")}
    resumed = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "resumed")}
    assert sorted(resumed) == list(range(21, 41))
    assert [resumed[s] for s in range(21, 41)] == pytest.approx([straight[s] for s in range(21, 41)], rel=1e-6)


@pytest.mark.slow
def test_resume_latest_continues_in_the_same_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    common = ("trainer.log_every=1", "trainer.checkpoint_every=10", "trainer.sample_every=0")
    train(run_dir, "trainer.max_steps=10", *common)
    result = train(run_dir, "trainer.max_steps=15", "trainer.resume=latest", *common)
    assert "Trained 15 steps" in result.stdout
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, 16))


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_exits_3_and_resume_matches_the_uninterrupted_run(tmp_path):
    """The stop skips the monitors due at its step (sample grids every step here): the grace period before the
    kill is for the checkpoint."""
    train(tmp_path / "straight", "trainer.max_steps=30", *QUIET)
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

    train(run_dir, "trainer.max_steps=30", "trainer.resume=latest", *QUIET)
    straight = [r["loss"] for r in read_metrics(tmp_path / "straight")]
    assert [r["loss"] for r in read_metrics(run_dir)] == pytest.approx(straight, rel=1e-6)
