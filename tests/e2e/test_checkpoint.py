"""Checkpoints that survive clusters (``training/state/checkpoint.py``, ``run_folder.py``) in ``train.py`` runs: an
atomic write that a kill -9 or a full disk cannot turn into a corrupt ``latest``, truncated files noticed, one run
folder shared by all ranks, and a fresh run that never mixes with another's checkpoints."""

import json
import math
import subprocess

import pytest

from dit_trainer.errors import EXIT_CHECKPOINT_FAILED
from dit_trainer.runs.run_folder import MANIFEST, incomplete_reason, list_checkpoints

from ..conftest import (
    CPU_PROCESSES,
    QUIET,
    TINY_SHAPES,
    accelerate_launch,
    read_metrics,
    run_here,
    run_script,
    start_training,
    train_here,
    wait_for,
)

pytestmark = pytest.mark.slow  # every test here trains or launches processes


PLANT_SLOW_WRITE = """
import time
from dit_trainer.training.state import checkpoint
write = checkpoint.Checkpointer._write_manifest
def slow(self, folder, step):
    if step == 4:
        time.sleep(600)  # the test kills the process here: files written, manifest and rename not yet
    write(self, folder, step)
checkpoint.Checkpointer._write_manifest = slow
"""
EVERY_2 = ("trainer.max_steps=6", "trainer.checkpoint_every=2")


def test_kill_9_during_a_checkpoint_write_leaves_the_previous_one_as_latest(tmp_path):
    run_dir = tmp_path / "run"
    process = start_training(run_dir, *EVERY_2, code=PLANT_SLOW_WRITE)
    partial = run_dir / "checkpoints" / ".checkpoint-4.partial"
    wait_for(lambda: (partial / "trainer_state_0.safetensors").is_file(), process)
    process.kill()  # SIGKILL: no handler, no cleanup
    process.communicate(timeout=60)
    previous = run_dir / "checkpoints" / "checkpoint-2"
    before = {p.name: p.read_bytes() for p in previous.rglob("*") if p.is_file()}
    assert incomplete_reason(previous) is None and not (run_dir / "checkpoints" / "checkpoint-4").exists()
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["checkpoint-2"]

    result = train_here(run_dir, *EVERY_2, "trainer.resume=latest", *QUIET)
    log = result.stdout + result.stderr
    assert "Resumed from" in log and "checkpoint-2 at step 2" in log
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == [f"checkpoint-{s}" for s in (2, 4, 6)]
    assert not partial.exists()
    assert {p.name: p.read_bytes() for p in previous.rglob("*") if p.is_file()} == before
    assert json.loads((run_dir / "checkpoints" / "checkpoint-4" / MANIFEST).read_text())["step"] == 4


# A tmpfs that holds the first checkpoint (~12.3 MB: two 3.1 MB weight files, a 6.2 MB optimizer state) and then
# runs out during the second: in the optimizer state (torch.save raises RuntimeError) or in the first weight file
# (safetensors raises SafetensorError).
@pytest.mark.parametrize(("disk_mb", "writer_error"), [(21, "RuntimeError"), (14, "SafetensorError")])
def test_a_full_disk_during_a_checkpoint_write_stops_with_exit_5_and_keeps_the_previous_one(
    small_disk, disk_mb, writer_error
):
    run_dir = small_disk(disk_mb * 2**20) / "run"
    result = run_here(["train.py", *TINY_SHAPES, *QUIET, f"hydra.run.dir={run_dir}", "trainer.max_steps=4",
                       "trainer.checkpoint_every=2"])  # fmt: skip
    assert result.returncode == EXIT_CHECKPOINT_FAILED, result.stderr[-3000:]
    assert "Could not write the checkpoint of step 4" in result.stderr and writer_error in result.stderr
    assert "checkpoint-2, is intact" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-2"]  # partial removed
    assert incomplete_reason(run_dir / "checkpoints" / "checkpoint-2") is None


def test_a_truncated_checkpoint_is_not_latest_and_is_refused_by_path(tmp_path):
    run_dir = tmp_path / "run"
    train_here(run_dir, "trainer.max_steps=4", "trainer.checkpoint_every=2", *QUIET)
    newest = run_dir / "checkpoints" / "checkpoint-4"
    optimizer = newest / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:100])  # a disk that filled up mid-file
    assert "optimizer.bin has 100 bytes" in incomplete_reason(newest)
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["checkpoint-2"]
    result = run_here(["train.py", *TINY_SHAPES, f"hydra.run.dir={tmp_path / 'other'}", f"trainer.resume={newest}"])
    assert result.returncode == 2 and "not a complete checkpoint" in result.stderr and "optimizer.bin" in result.stderr


def test_a_newest_checkpoint_that_does_not_load_is_reported_and_the_previous_one_resumed(tmp_path):
    """Damage that keeps every size (bit rot, a bad sector) passes the manifest check; loading finds it."""
    run_dir = tmp_path / "run"
    train_here(run_dir, "trainer.max_steps=4", "trainer.checkpoint_every=2", *QUIET)
    optimizer = run_dir / "checkpoints" / "checkpoint-4" / "optimizer.bin"
    optimizer.write_bytes(bytes(optimizer.stat().st_size))
    assert incomplete_reason(optimizer.parent) is None
    result = train_here(run_dir, "trainer.max_steps=6", "trainer.checkpoint_every=2", "trainer.resume=latest", *QUIET)
    log = " ".join((result.stdout + result.stderr).split())
    assert f"{run_dir}/checkpoints/checkpoint-4 could not be loaded (" in log
    assert f"resuming from {run_dir}/checkpoints/checkpoint-2 instead" in log and "at step 2" in log
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4, 5, 6]  # 3 and 4 trained again
    assert incomplete_reason(optimizer.parent) is None and optimizer.read_bytes() != bytes(len(optimizer.read_bytes()))


def test_a_fresh_run_refuses_a_folder_with_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    train_here(run_dir, "trainer.max_steps=2", *QUIET)
    checkpoint = run_dir / "checkpoints" / "checkpoint-2" / "transformer" / "diffusion_pytorch_model.safetensors"
    before = checkpoint.read_bytes()
    result = run_here(["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", "trainer.max_steps=2"])
    assert result.returncode == 2
    assert "trainer.resume=latest" in result.stderr and "checkpoint-2" in result.stderr
    assert checkpoint.read_bytes() == before and len(read_metrics(run_dir)) == 2


def _launch(processes: int, *args: str) -> subprocess.CompletedProcess:
    return run_script([*accelerate_launch(processes), "train.py", *TINY_SHAPES, *QUIET, *args], timeout=300,
                      env=CPU_PROCESSES)  # fmt: skip


# Cosine after 2 warm-up steps, in updates of 2 accumulated micro-batches of 4 images: an LR of its own every step.
SCHEDULE = ("optim.lr_schedule=cosine", "optim.warmup_steps=2", "trainer.gradient_accumulation_steps=2",
            "trainer.batch_size=4", "trainer.max_steps=9")  # fmt: skip


def test_processes_share_one_run_folder_checkpoint_and_resume_on_fewer_at_the_same_lr(tmp_path):
    """3 DDP processes train 9 steps; resumed from step 6 on 2 in the same folder, steps 7-9 have the LR the
    uninterrupted run had (the schedule counts optimizer updates, not updates x processes)."""
    runs = tmp_path / "runs"
    # Microseconds in the folder name: with each rank's own clock (Hydra's ${now:}) the ranks would split it.
    first = _launch(3, f"hydra.run.dir={runs}/${{launch_time:%H-%M-%S-%f}}", *SCHEDULE, "trainer.checkpoint_every=3")
    assert first.returncode == 0, first.stderr[-4000:]
    [run_dir] = list(runs.iterdir())
    checkpoints = ["checkpoint-3", "checkpoint-6", "checkpoint-9"]
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == checkpoints
    for rank in range(3):
        assert (run_dir / "checkpoints" / "checkpoint-6" / f"trainer_state_{rank}.safetensors").is_file()
    straight = {r["step"]: r["lr"] for r in read_metrics(run_dir)}

    checkpoint = run_dir / "checkpoints" / "checkpoint-6"
    resumed = _launch(2, f"hydra.run.dir={run_dir}", *SCHEDULE, f"trainer.resume={checkpoint}")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert resumed.stdout.count("Trained 9 steps") == 1 and "written by 3 processes, on 2" in resumed.stdout
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(1, 10)) and len({straight[s] for s in (7, 8, 9)}) == 3
    assert all(math.isclose(r["lr"], straight[r["step"]], rel_tol=1e-6, abs_tol=1e-12) for r in records[6:]), records
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")] == []
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == checkpoints  # checkpoint-9 saved again
    assert list(runs.iterdir()) == [run_dir]
