"""Runs that survive clusters: preemption signals, kill -9 during a checkpoint write, non-finite losses."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dit_trainer.training.checkpoint import MANIFEST, incomplete_reason, list_checkpoints
from dit_trainer.training.preemption import EXIT_CHECKPOINT_FAILED, EXIT_NONFINITE, EXIT_PREEMPTED

from .conftest import REPO, TINY_SHAPES, run_script, train

QUIET = ("trainer.log_every=1", "trainer.sample_every=0")


def _metrics(run_dir) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _start(run_dir, *overrides: str, code: str | None = None) -> subprocess.Popen:
    """train.py in the background; ``code`` runs first in the same interpreter (to plant a delay)."""
    argv = ["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *QUIET, *overrides]
    launch = f"import runpy, sys\nsys.argv = {argv!r}\nrunpy.run_path('train.py', run_name='__main__')"
    command = [sys.executable, *argv] if code is None else [sys.executable, "-c", f"{code}\n{launch}"]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_sigterm_writes_a_checkpoint_exits_3_and_resume_matches_the_uninterrupted_run(tmp_path):
    train(tmp_path / "straight", "trainer.max_steps=30", *QUIET)
    run_dir = tmp_path / "preempted"
    process = _start(run_dir, "trainer.max_steps=30", "trainer.checkpoint_every=0")
    _wait_for(lambda: len(_metrics(run_dir)) >= 3, process)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == EXIT_PREEMPTED, stderr[-3000:]
    stopped = len(_metrics(run_dir))
    assert 3 <= stopped < 30 and "Preempted at step" in stdout
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == [f"checkpoint-{stopped}"]

    train(run_dir, "trainer.max_steps=30", "trainer.resume=latest", *QUIET)
    straight = [r["loss"] for r in _metrics(tmp_path / "straight")]
    assert [r["loss"] for r in _metrics(run_dir)] == pytest.approx(straight, rel=1e-6)


PLANT_SLOW_WRITE = """
import time
from dit_trainer.training import checkpoint
write = checkpoint.Checkpointer._write_manifest
def slow(self, folder, step):
    if step == 20:
        time.sleep(600)  # the test kills the process here: files written, manifest and rename not yet
    write(self, folder, step)
checkpoint.Checkpointer._write_manifest = slow
"""


def test_kill_9_during_a_checkpoint_write_leaves_the_previous_one_as_latest(tmp_path):
    run_dir = tmp_path / "run"
    process = _start(run_dir, "trainer.max_steps=30", "trainer.checkpoint_every=10", code=PLANT_SLOW_WRITE)
    partial = run_dir / "checkpoints" / ".checkpoint-20.partial"
    _wait_for(lambda: (partial / "trainer_state_0.safetensors").is_file(), process)
    process.kill()  # SIGKILL: no handler, no cleanup
    process.communicate(timeout=60)
    previous = run_dir / "checkpoints" / "checkpoint-10"
    before = {p.name: p.read_bytes() for p in previous.rglob("*") if p.is_file()}
    assert incomplete_reason(previous) is None and not (run_dir / "checkpoints" / "checkpoint-20").exists()
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["checkpoint-10"]

    result = train(run_dir, "trainer.max_steps=30", "trainer.checkpoint_every=10", "trainer.resume=latest", *QUIET)
    log = result.stdout + result.stderr
    assert "Resumed from" in log and "checkpoint-10 at step 10" in log
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == [f"checkpoint-{s}" for s in (10, 20, 30)]
    assert not partial.exists()
    assert {p.name: p.read_bytes() for p in previous.rglob("*") if p.is_file()} == before
    assert json.loads((run_dir / "checkpoints" / "checkpoint-20" / MANIFEST).read_text())["step"] == 20


PLANT_FULL_DISK = """
import errno, os
from dit_trainer.training import checkpoint
save = checkpoint.TrainingState.save
def full(self, path):
    if self.step == 20:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    save(self, path)
checkpoint.TrainingState.save = full
"""


def test_a_full_disk_during_a_checkpoint_write_stops_with_exit_5_and_keeps_the_previous_one(tmp_path):
    run_dir = tmp_path / "run"
    process = _start(run_dir, "trainer.max_steps=30", "trainer.checkpoint_every=10", code=PLANT_FULL_DISK)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == EXIT_CHECKPOINT_FAILED, stderr[-3000:]
    assert "Could not write the checkpoint of step 20" in stderr and "No space left on device" in stderr
    assert "checkpoint-10, is intact" in stderr and "Traceback" not in stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["checkpoint-10"]  # partial removed
    assert incomplete_reason(run_dir / "checkpoints" / "checkpoint-10") is None


def test_a_truncated_checkpoint_is_not_latest_and_is_refused_by_path(tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, "trainer.max_steps=4", "trainer.checkpoint_every=2", *QUIET)
    newest = run_dir / "checkpoints" / "checkpoint-4"
    optimizer = newest / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:100])  # a disk that filled up mid-file
    assert "optimizer.bin has 100 bytes" in incomplete_reason(newest)
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["checkpoint-2"]
    result = run_script(
        ["train.py", *TINY_SHAPES, f"hydra.run.dir={tmp_path / 'other'}", f"trainer.resume={newest}"], timeout=120
    )
    assert result.returncode == 2 and "not a complete checkpoint" in result.stderr and "optimizer.bin" in result.stderr


def test_a_planted_nan_is_skipped_then_stops_the_run_with_a_report(tmp_path):
    run_dir = tmp_path / "run"
    result = run_script(
        ["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *QUIET, "trainer.max_steps=30", "optim.lr=1e6",
         "optim.warmup_steps=0", "trainer.max_consecutive_nonfinite=3"],
        timeout=240,
    )  # fmt: skip
    assert result.returncode == EXIT_NONFINITE, result.stderr[-3000:]
    error = result.stderr
    assert "NaN/inf for 3 consecutive steps" in error and "lower the learning rate" in error
    assert "Parameters with non-finite gradients: transformer." in error and "Traceback" not in error
    records = _metrics(run_dir)
    assert [r["skipped_steps"] for r in records] == [0, 1, 2]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX signals")
def test_the_preemption_handler_turns_signals_into_a_flag_and_restores_handlers():
    from dit_trainer.training.preemption import PreemptionHandler

    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionHandler() as handler:
        assert handler.requested is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert handler.requested == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal keeps the first reason
        assert handler.requested == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) == before


def _launch_2_processes(*args: str) -> subprocess.CompletedProcess:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launch = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port)]  # fmt: skip
    return run_script([*launch, "train.py", *TINY_SHAPES, *QUIET, *args], timeout=300,
                      env={"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"})  # fmt: skip


def test_two_processes_share_one_run_folder_checkpoint_and_resume(tmp_path):
    runs = tmp_path / "runs"
    # Microseconds in the folder name: with each rank's own clock (Hydra's ${now:}) the ranks would split it.
    first = _launch_2_processes(f"hydra.run.dir={runs}/${{launch_time:%H-%M-%S-%f}}", "trainer.max_steps=6",
                                "trainer.checkpoint_every=3")  # fmt: skip
    assert first.returncode == 0, first.stderr[-4000:]
    [run_dir] = list(runs.iterdir())
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["checkpoint-3", "checkpoint-6"]
    for rank in (0, 1):
        assert (run_dir / "checkpoints" / "checkpoint-6" / f"trainer_state_{rank}.safetensors").is_file()

    resumed = _launch_2_processes(f"hydra.run.dir={run_dir}", "trainer.max_steps=9", "trainer.resume=latest")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert resumed.stdout.count("Trained 9 steps") == 2
    assert [r["step"] for r in _metrics(run_dir)] == list(range(1, 10))
    assert list(runs.iterdir()) == [run_dir]
