"""One run per run folder: the main process of a run holds ``RUN/.lock`` for the run's life, so a second launch into
the same folder (a reused Slurm job name, two launches in the same second) is refused instead of the two deleting
and replacing each other's checkpoints.

The lock is an ``flock`` on the file, which the kernel drops when its process dies, plus a record of the holder
(host, pid, Slurm job) whose modification time is refreshed every ``HEARTBEAT_SECONDS``. On the holder's host the
``flock`` says exactly whether it still runs. Across hosts on a shared file system (where ``flock`` may not reach),
a record refreshed within ``STALE_AFTER_SECONDS`` counts as alive. A stale lock (its process killed, its node gone)
is taken over with a warning that names the old holder, never silently.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dit_trainer.errors import ConfigError

LOCK = ".lock"
HEARTBEAT_SECONDS = 30.0
STALE_AFTER_SECONDS = 300.0

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: enough to find the process, or its job, by hand."""

    host: str
    pid: int
    job: str | None

    @classmethod
    def this_process(cls) -> Holder:
        return cls(socket.gethostname(), os.getpid(), os.environ.get("SLURM_JOB_ID"))

    def describe(self) -> str:
        job = f", Slurm job {self.job}" if self.job else ""
        return f"process {self.pid} on {self.host}{job}"


class RunFolderLock:
    """``with RunFolderLock(run_dir):`` holds the run folder; ``ConfigError`` (naming ``hydra.run.dir``) when a live
    run holds it."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK
        self._descriptor: int | None = None
        self._stop = threading.Event()

    def __enter__(self) -> RunFolderLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def acquire(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        descriptor = self._open_locked()
        previous, age = _read_holder(descriptor), time.time() - os.fstat(descriptor).st_mtime
        if previous is not None and previous.host != socket.gethostname() and age < STALE_AFTER_SECONDS:
            os.close(descriptor)  # flock may not reach across hosts: a fresh record is a live run elsewhere
            raise self._held_by(previous, f"its lock was refreshed {age:.0f} s ago")
        if previous is not None:
            why = "it is no longer running" if previous.host == socket.gethostname() else f"silent for {age:.0f} s"
            logger.warning(f"{self.path}: taking over the stale lock of {previous.describe()} ({why})")
        _write_holder(descriptor, Holder.this_process())
        self._descriptor = descriptor
        threading.Thread(target=self._heartbeat, name="run-folder-lock", daemon=True).start()

    def release(self) -> None:
        """Give the folder back (the record first, so nobody reads it as a stale lock)."""
        if self._descriptor is None:
            return
        self._stop.set()
        self.path.unlink(missing_ok=True)
        os.close(self._descriptor)  # drops the flock
        self._descriptor = None

    def _open_locked(self) -> int:
        """A descriptor of ``self.path`` with our ``flock`` on it; refused while a live process holds one."""
        while True:
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(descriptor)
                os.close(descriptor)
                raise self._held_by(holder, "it is running") from None
            if _is_current(descriptor, self.path):
                return descriptor
            os.close(descriptor)  # released and removed between our open and our flock: try the new file

    def _held_by(self, holder: Holder | None, evidence: str) -> ConfigError:
        who = holder.describe() if holder else "another process"
        return ConfigError(
            "hydra.run.dir",
            str(self.run_dir),
            f"{who} is training in that folder ({evidence}), and two runs in one folder would delete and replace "
            "each other's checkpoints",
            "wait for that run to end (or stop it), or give this one its own folder, e.g. "
            "`hydra.run.dir=outputs/NAME`; if that process is certainly gone, delete "
            f"{self.path}",
        )

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self.path)
            except OSError:  # removed by hand or a file-system hiccup: the next beat tries again
                continue


# Run folders (absolute) whose lock this process's launch took before Hydra wrote into them (``RunFolderCheck``),
# held for the run that starts there (``lock_for_run``): another launch is refused from the first moment on, not only
# once the models and the accelerator are built.
_held_for_the_run: dict[str, RunFolderLock] = {}


def hold_for_run(run_dir: Path) -> None:
    """Take ``run_dir``'s lock for the run this launch is about to start there; given back at the latest when the
    process exits (a start refused before it took the lock over)."""
    lock = RunFolderLock(run_dir)
    lock.acquire()
    _held_for_the_run[os.path.abspath(run_dir)] = lock
    atexit.register(lock.release)


def lock_for_run(run_dir: Path) -> RunFolderLock:
    """The lock of the run starting in ``run_dir``: the one this launch took (``hold_for_run``), else taken now (a
    trainer built from Python)."""
    lock = _held_for_the_run.pop(os.path.abspath(run_dir), None)
    if lock is None:
        lock = RunFolderLock(run_dir)
        lock.acquire()
    return lock


def release_held(run_dir: Path) -> None:
    """Give back the lock this launch took on ``run_dir`` and no run took over (a refused start)."""
    lock = _held_for_the_run.pop(os.path.abspath(run_dir), None)
    if lock is not None:
        lock.release()


def _is_current(descriptor: int, path: Path) -> bool:
    """Whether ``descriptor`` is still the file at ``path`` (a releasing holder removes it)."""
    try:
        return os.stat(path).st_ino == os.fstat(descriptor).st_ino
    except FileNotFoundError:
        return False


def _read_holder(descriptor: int) -> Holder | None:
    """The record in the lock file; None when empty (a holder killed before writing it) or unreadable."""
    try:
        return Holder(**json.loads(os.pread(descriptor, 4096, 0)))
    except (ValueError, TypeError):
        return None


def _write_holder(descriptor: int, holder: Holder) -> None:
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(asdict(holder)).encode(), 0)
    os.fsync(descriptor)
