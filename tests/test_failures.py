"""One process of a multi-process run fails: every process stops at once with its message and exit code, and job
scripts get that code back from the run folder (``failures.py``)."""

import json
import socket
import subprocess
import sys
import time

import pytest

from dit_trainer.errors import EXIT_CHECKPOINT_FAILED

from .conftest import REPO, TINY_SHAPES

WATCHER = """
import os, sys, time
from pathlib import Path
from dit_trainer.failures import FailureWatch
os.environ["RANK"] = "0"
FailureWatch(Path(sys.argv[1])).start()
print("watching", flush=True)
time.sleep(600)  # a main thread that never returns to Python by itself, like one blocked in a collective
"""


def _record(run_dir, rank: int, code: int, message: str) -> None:
    """``record_failure`` as process ``rank`` would call it (in a child: RANK is read from the environment)."""
    script = (
        f"from pathlib import Path\nfrom dit_trainer.failures import record_failure\n"
        f"record_failure(Path({str(run_dir)!r}), {code}, {message!r})"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, env={"RANK": str(rank)}, check=True)


def test_a_watching_process_stops_with_the_first_failure_another_records(tmp_path):
    earlier_attempt = {"rank": 3, "exit_code": 2, "message": "an earlier attempt failed", "time": time.time() - 3600}
    (tmp_path / ".failure-node-1.json").write_text(json.dumps(earlier_attempt))  # older than the launcher: ignored
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert watcher.stdout.readline() == "watching\n"
    time.sleep(1.5)
    assert watcher.poll() is None
    _record(tmp_path, rank=1, code=5, message="Could not write the checkpoint of step 4")
    _record(tmp_path, rank=2, code=2, message="a later failure")
    started = time.monotonic()
    _, stderr = watcher.communicate(timeout=30)
    assert watcher.returncode == 5 and time.monotonic() - started < 3
    assert "process 1 failed, so this one (0) stops: Could not write the checkpoint of step 4" in stderr
    since = str(time.time() - 60)
    command = [sys.executable, "-m", "dit_trainer.failures", str(tmp_path), "--since", since]
    assert subprocess.run(command, cwd=REPO, capture_output=True, text=True).stdout.strip() == "5"  # the first
    empty = [*command[:3], str(tmp_path / "none"), "--since", since, "--default", "1"]
    assert subprocess.run(empty, cwd=REPO, capture_output=True, text=True).stdout.strip() == "1"


PLANT = """
import runpy, sys
from dit_trainer.training import checkpoint
save = checkpoint.TrainingState.save
def full(self, path):
    if self.step == 4 and path.name == "trainer_state_1.safetensors":  # only rank 1's disk is full
        raise OSError(28, "No space left on device", str(path))
    save(self, path)
checkpoint.TrainingState.save = full
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


@pytest.mark.slow
def test_when_one_rank_fails_both_stop_with_its_message_and_the_job_gets_its_code(tmp_path):
    (tmp_path / "plant.py").write_text(PLANT)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run_dir, launched = tmp_path / "run", time.time()
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--master_port", str(port)]
    result = subprocess.run(
        [sys.executable, *launch, str(tmp_path / "plant.py"), *TINY_SHAPES, f"hydra.run.dir={run_dir}",
         "trainer.max_steps=8", "trainer.checkpoint_every=4", "trainer.sample_every=0"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 1  # torchrun's own code for any failed rank
    output = result.stdout + result.stderr
    assert "process 1 failed, so this one (0) stops: Could not write the checkpoint of step 4" in output
    assert "Connection closed by peer" not in output  # rank 0 stops on rank 1's message, not the transport's
    assert "exitcode  : 5" in output and "exitcode  : 1" not in output  # both ranks exit with rank 1's code
    command = [sys.executable, "-m", "dit_trainer.failures", str(run_dir), "--since", str(launched)]
    code = subprocess.run(command, cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert code == str(EXIT_CHECKPOINT_FAILED)
