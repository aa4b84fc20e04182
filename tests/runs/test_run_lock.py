"""One run per run folder (``run_lock.py``): a live holder refuses a second run, a dead one's lock is taken over with
a warning that names it, and a holder on another host counts as alive while its record is fresh. (A second
train.py launched into a running run's folder: tests/e2e/test_run_lock.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dit_trainer.errors import ConfigError
from dit_trainer.runs.run_lock import (
    LOCK,
    STALE_AFTER_SECONDS,
    RunFolderLock,
    hold_for_run,
    lock_for_run,
    release_held,
)
from tests.conftest import REPO


def test_a_second_lock_on_a_held_folder_is_refused_naming_the_holder(tmp_path):
    with RunFolderLock(tmp_path / "run"), pytest.raises(ConfigError) as caught:
        RunFolderLock(tmp_path / "run").acquire()
    message = str(caught.value)
    assert "`hydra.run.dir`" in message and f"process {os.getpid()}" in message and "it is running" in message
    assert not (tmp_path / "run" / LOCK).exists()  # released
    with RunFolderLock(tmp_path / "run"):  # and free again
        pass


def test_a_launchs_lock_is_held_from_its_folder_check_until_its_run_takes_it_over(tmp_path):
    """Taken at the folder check (before Hydra writes) and only tested there, the lock was free during the start-up
    (imports, the accelerator): a second launch then got in, and its refusal, recorded as a failure in the folder,
    stopped the first run."""
    hold_for_run(tmp_path / "run")
    with pytest.raises(ConfigError, match=f"process {os.getpid()}"):
        RunFolderLock(tmp_path / "run").acquire()  # another launch, during the start-up
    lock = lock_for_run(tmp_path / "run")  # the run takes over the launch's lock
    with pytest.raises(ConfigError):
        RunFolderLock(tmp_path / "run").acquire()
    release_held(tmp_path / "run")  # nothing left to give back: the run holds it
    assert (tmp_path / "run" / LOCK).exists()
    lock.release()
    hold_for_run(tmp_path / "refused")
    release_held(tmp_path / "refused")  # a refused start gives it back
    assert not (tmp_path / "refused" / LOCK).exists()
    lock_for_run(tmp_path / "refused").release()  # no launch held it: taken at once (a trainer built from Python)


def test_the_lock_of_a_killed_process_is_taken_over_with_a_warning(tmp_path, caplog):
    holder = subprocess.Popen(
        [sys.executable, "-c", "from dit_trainer.runs.run_lock import RunFolderLock; RunFolderLock(__import__("
         f"'pathlib').Path({str(tmp_path)!r})).acquire(); print('held', flush=True); __import__('time').sleep(600)"],
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
