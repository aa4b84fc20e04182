"""When one process of a multi-process run fails, every process stops at once with its message and exit code.

Without this the others wait in their next collective until a timeout (NCCL) or die on the transport's "connection
closed" traceback (gloo), and the launcher (torchrun, ``accelerate launch``) exits 1 whatever the failing process's
code was. So a process that fails with a user error records it in the run folder (``.failure-HOST-PID.json``; on
multi-node jobs the run folder is on shared storage), and every process watches for records in a thread: on the
first one written since it started by a process of its own launch, it prints that message and exits with that code.
Job scripts get the code back with ``python -m dit_trainer.runs.failures RUN_DIR --since EPOCH_SECONDS``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from dit_trainer.durable import write_text_atomically

POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Failure:
    rank: int
    exit_code: int
    message: str
    time: float
    launch: str | None = None  # ``this_launch()`` of the process that failed (None: recorded before launches were)


def this_launch() -> str | None:
    """What the processes of one launch share and another launch into the same folder cannot: its rendezvous address
    (``MASTER_ADDR:MASTER_PORT``, set by torchrun and ``accelerate launch``); None outside a launch (a job script)."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{address}:{port}" if address and port else None


def is_multi_process() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def record_failure(run_dir: Path, exit_code: int, message: str) -> None:
    """What this process failed with, for the other processes and the job script."""
    failure = Failure(int(os.environ.get("RANK", "0")), exit_code, message, time.time(), this_launch())
    name = f".failure-{socket.gethostname()}-{os.getpid()}.json"
    write_text_atomically(run_dir / name, json.dumps(asdict(failure)))


def let_the_others_notice() -> None:
    """Linger after recording a failure, for two polls of the other processes' watches: they then stop with its
    message and code before the launcher terminates them because this process exited (torchrun sends SIGTERM at
    once, and a process that skips the interpreter's teardown exits within milliseconds)."""
    time.sleep(2 * POLL_SECONDS)


def first_failure(run_dir: Path, since: float, launch: str | None = None) -> Failure | None:
    """The earliest failure recorded at or after ``since`` (older records are from earlier attempts), by a process of
    ``launch`` when it is given: a second launch refused in a live run's folder must not stop that run."""
    failures = []
    for path in run_dir.glob(".failure-*.json"):
        try:
            failures.append(Failure(**json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError):  # removed meanwhile, or not ours
            continue
    recent = [f for f in failures if f.time >= since and (launch is None or f.launch in (None, launch))]
    return min(recent, key=lambda failure: failure.time, default=None)


class FailureWatch:
    """A daemon thread that ends this process with the first failure another process records (a thread, so that it
    acts while the main thread is blocked in a collective)."""

    def __init__(self, run_dir: Path, before_exit: Callable[[Failure], None] | None = None) -> None:
        self.run_dir = run_dir
        self.before_exit = before_exit  # what this process still does when another's failure ends it
        # Records older than the launcher (torchrun) are from earlier attempts; its start time is known to the
        # second (psutil's clock), and a requeued attempt starts far later than that.
        self.since = psutil.Process(os.getppid()).create_time() - 1.0
        self.rank = int(os.environ.get("RANK", "0"))

    def start(self) -> FailureWatch:
        threading.Thread(target=self._watch, name="failure-watch", daemon=True).start()
        return self

    def failure_elsewhere(self) -> Failure | None:
        failure = first_failure(self.run_dir, self.since, this_launch())
        return failure if failure is not None and failure.rank != self.rank else None

    def exit_on(self, failure: Failure) -> None:
        print(f"error: process {failure.rank} failed, so this one ({self.rank}) stops: {failure.message}", flush=True,
              file=sys.stderr)  # fmt: skip
        if self.before_exit is not None:
            with contextlib.suppress(Exception):  # nothing may keep this process from ending
                self.before_exit(failure)
        os._exit(failure.exit_code)  # the main thread may be blocked in a collective that never returns

    def stop_if_failed_elsewhere(self, timeout: float) -> None:
        """After an error of this process's own (a collective broken by another's exit): if another process
        failed first, stop with its message and code instead of a traceback. Waits up to ``timeout`` for its
        record, which shared file systems show late."""
        deadline = time.monotonic() + timeout
        while True:
            failure = self.failure_elsewhere()
            if failure is not None:
                self.exit_on(failure)
            if time.monotonic() >= deadline:
                return
            time.sleep(POLL_SECONDS)

    def _watch(self) -> None:
        while True:
            failure = self.failure_elsewhere()
            if failure is not None:
                self.exit_on(failure)
            time.sleep(POLL_SECONDS)


def main() -> int:
    parser = argparse.ArgumentParser(description="Print the exit code of a run's first failed process (or --default).")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--since", type=float, required=True, help="the launch time, in seconds since the epoch")
    parser.add_argument("--default", type=int, default=1, help="printed when no failure was recorded")
    args = parser.parse_args()
    failure = first_failure(args.run_dir, args.since)
    print(args.default if failure is None else failure.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
