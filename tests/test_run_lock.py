"""One run per run folder (``run_lock.py``): a live holder refuses a second run, a dead one's lock is taken over
with a warning that names it, and a holder on another host counts as alive while its record is fresh."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dit_trainer.errors import ConfigError
from dit_trainer.run_lock import LOCK, STALE_AFTER_SECONDS, RunFolderLock

from .conftest import REPO, TINY_SHAPES, read_metrics, run_script, start_training, wait_for


def test_a_second_lock_on_a_held_folder_is_refused_naming_the_holder(tmp_path):
    with RunFolderLock(tmp_path / "run"), pytest.raises(ConfigError) as caught:
        RunFolderLock(tmp_path / "run").acquire()
    message = str(caught.value)
    assert "`hydra.run.dir`" in message and f"process {os.getpid()}" in message and "it is running" in message
    assert not (tmp_path / "run" / LOCK).exists()  # released
    with RunFolderLock(tmp_path / "run"):  # and free again
        pass


def test_the_lock_of_a_killed_process_is_taken_over_with_a_warning(tmp_path, caplog):
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from dit_trainer.run_lock import RunFolderLock; RunFolderLock(__import__('pathlib')"
         f".Path({str(tmp_path)!r})).acquire(); print('held', flush=True); __import__('time').sleep(600)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(ConfigError, match="it is running"):
        RunFolderLock(tmp_path).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == holder.pid  # what a kill -9 leaves behind
    with RunFolderLock(tmp_path):
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()
    assert f"taking over the stale lock of process {holder.pid}" in caplog.text and "no longer running" in caplog.text


def _plant_record(folder, host: str, age: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK).write_text(json.dumps({"host": host, "pid": 4242, "job": "77"}))
    past = time.time() - age
    os.utime(folder / LOCK, (past, past))


def test_a_fresh_lock_from_another_host_is_respected_and_a_silent_one_taken_over(tmp_path, caplog):
    _plant_record(tmp_path, "node-b", age=10)
    with pytest.raises(ConfigError) as caught:
        RunFolderLock(tmp_path).acquire()
    assert "process 4242 on node-b, Slurm job 77" in str(caught.value) and "refreshed 10 s ago" in str(caught.value)

    _plant_record(tmp_path, "node-b", age=STALE_AFTER_SECONDS + 60)
    with RunFolderLock(tmp_path):
        pass
    assert "stale lock of process 4242 on node-b, Slurm job 77 (silent for" in caplog.text


@pytest.mark.slow
def test_a_second_launch_into_a_running_run_s_folder_is_refused_and_the_first_carries_on(tmp_path):
    run_dir = tmp_path / "run"
    first = start_training(run_dir, "trainer.max_steps=100000", "trainer.log_every=1", "trainer.sample_every=0")
    wait_for(lambda: len(read_metrics(run_dir)) >= 2, first)
    hydra_files = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    second = run_script(["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", "trainer.resume=latest"], timeout=120)
    assert second.returncode == 2 and f"process {first.pid} on" in second.stderr
    assert "Traceback" not in second.stderr
    assert {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()} == hydra_files  # refused before Hydra wrote
    steps_so_far = len(read_metrics(run_dir))
    wait_for(lambda: len(read_metrics(run_dir)) > steps_so_far, first)  # still training after the refusal
    first.send_signal(signal.SIGTERM)  # preempted: it checkpoints, exits 3 and releases the folder
    _, stderr = first.communicate(timeout=240)
    assert first.returncode == 3, stderr[-3000:]
    steps = [r["step"] for r in read_metrics(run_dir) if "loss" in r]
    assert steps == list(range(1, len(steps) + 1)) and not (run_dir / LOCK).exists()
