"""One run per run folder (``run_lock.py``) with ``train.py``: a second launch into a running run's folder is refused
before Hydra writes anything, and the first carries on."""

import os
import signal

import pytest
from omegaconf import OmegaConf

from dit_trainer.runs.launch_folder import RunFolderCheck
from dit_trainer.runs.run_lock import LOCK, release_held

from ..conftest import QUIET, TINY_SHAPES, read_metrics, run_script, start_training, wait_for


@pytest.mark.slow
def test_a_second_launch_into_a_running_run_s_folder_is_refused_and_the_first_carries_on(tmp_path):
    run_dir = tmp_path / "run"
    first = start_training(run_dir, "trainer.max_steps=100000", *QUIET)
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


def test_a_second_launch_during_the_first_s_start_up_is_refused(tmp_path):
    """The first launch's folder check held the lock only for the check, and its run took it once the accelerator
    was built: a launch in between got in, wrote its Hydra record over the first's and, refused later, stopped the
    first run. Here this process is the first launch, between its folder check and its run."""
    run_dir = tmp_path / "run"
    hydra = {"run": {"dir": str(run_dir)}, "output_subdir": ".hydra", "job": {"name": "train"}}
    RunFolderCheck().on_run_start(OmegaConf.create({"hydra": hydra, "trainer": {"resume": None}}))
    try:
        second = run_script(["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *QUIET], timeout=120)
        assert second.returncode == 2 and f"process {os.getpid()} on" in second.stderr
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK]  # nothing of the second's written
    finally:
        release_held(run_dir)
