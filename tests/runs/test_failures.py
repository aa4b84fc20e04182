"""One process of a multi-process run fails (``failures.py``): every process stops at once with its message and exit
code, and job scripts get that code back from the run folder. (Two ranks of train.py: tests/e2e/test_failures.py.)"""

import json
import os
import subprocess
import sys
import time

from tests.conftest import REPO

WATCHER = """
import os, sys, time
from pathlib import Path
from dit_trainer.runs.failures import FailureWatch
os.environ["RANK"] = "0"
FailureWatch(Path(sys.argv[1])).start()
print("watching", flush=True)
time.sleep(600)  # a main thread that never returns to Python by itself, like one blocked in a collective
"""


LAUNCH = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}  # what torchrun gives every process of a launch


def _record(run_dir, rank: int, code: int, message: str, launch: dict[str, str] = LAUNCH) -> None:
    """``record_failure`` as process ``rank`` of ``launch`` would call it (in a child: read from the environment)."""
    script = (
        f"from pathlib import Path\nfrom dit_trainer.runs.failures import record_failure\n"
        f"record_failure(Path({str(run_dir)!r}), {code}, {message!r})"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, env={"RANK": str(rank), **launch}, check=True)


def test_a_watching_process_stops_with_the_first_failure_another_records(tmp_path):
    earlier_attempt = {"rank": 3, "exit_code": 2, "message": "an earlier attempt failed", "time": time.time() - 3600}
    (tmp_path / ".failure-node-1.json").write_text(json.dumps(earlier_attempt))  # older than the launcher: ignored
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, **LAUNCH})  # fmt: skip
    assert watcher.stdout.readline() == "watching\n"
    # Another launch into the folder, refused (its main process failed while this launch's ran): not this one's.
    _record(tmp_path, rank=0, code=2, message="another launch", launch={**LAUNCH, "MASTER_PORT": "29401"})
    since = str(time.time())  # the job script's launch time: after that record
    time.sleep(1.5)
    assert watcher.poll() is None
    _record(tmp_path, rank=1, code=5, message="Could not write the checkpoint of step 4")
    _record(tmp_path, rank=2, code=2, message="a later failure")
    started = time.monotonic()
    _, stderr = watcher.communicate(timeout=30)
    assert watcher.returncode == 5 and time.monotonic() - started < 3
    assert "process 1 failed, so this one (0) stops: Could not write the checkpoint of step 4" in stderr
    command = [sys.executable, "-m", "dit_trainer.runs.failures", str(tmp_path), "--since", since]
    assert subprocess.run(command, cwd=REPO, capture_output=True, text=True).stdout.strip() == "5"  # the first
    empty = [*command[:3], str(tmp_path / "none"), "--since", since, "--default", "1"]
    assert subprocess.run(empty, cwd=REPO, capture_output=True, text=True).stdout.strip() == "1"
