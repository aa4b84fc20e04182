"""Ctrl-C and resuming by folder, as a user does it: Ctrl-C (SIGINT to the process group, as a terminal sends it)
writes a checkpoint and exits 130 without a traceback; then ``python train.py trainer.resume=RUN`` alone continues
that run in its folder with the config it recorded (no pinned ``hydra.run.dir``, no repeated overrides) and gives the
losses of the uninterrupted run; a resume refused for a bad value leaves the folder as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch
from omegaconf import OmegaConf

from dit_trainer.config import register_configs
from dit_trainer.errors import EXIT_INTERRUPTED
from dit_trainer.runs.run_folder import list_checkpoints

from ..conftest import REPO, TINY_SHAPES, digest, read_metrics, run_here
from .family_runs import train_in_process

STEPS = 6
# Every step logged, a checkpoint only at the end (or at a stop), 64 shapes in batches of 8 (not the defaults: a
# resume that fell back on them would train on other batches).
RUN = ("data.length=64", "trainer.batch_size=8", "trainer.log_every=1", "trainer.sample_every=0",
       "trainer.checkpoint_every=0", f"trainer.max_steps={STEPS}")  # fmt: skip
# Planted before train.py in the training process: the terminal's Ctrl-C (to the whole process group) right after
# step 3's metrics line; the run stops after the step under way, step 4.
CTRL_C_AT_STEP_3 = """
import os, signal
from dit_trainer.training.metrics import MetricsFile
write = MetricsFile.write
def write_then_ctrl_c(self, metrics):
    write(self, metrics)
    if metrics.get("step") == 3:
        os.killpg(0, signal.SIGINT)
MetricsFile.write = write_then_ctrl_c
"""


@contextmanager
def one_thread():
    """The thread count of the subprocess run (``OMP_NUM_THREADS=1``), so that their losses compare bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_ctrl_c_checkpoints_and_resume_by_folder_alone_continues_like_the_uninterrupted_run(tmp_path, monkeypatch):
    with one_thread():
        straight = train_in_process(tmp_path / "straight", *RUN)
    run_dir = tmp_path / "run"
    argv = ["train.py", *TINY_SHAPES, *RUN, f"hydra.run.dir={run_dir}"]
    launch = f"import runpy, sys\nsys.argv = {argv!r}\nrunpy.run_path('train.py', run_name='__main__')"
    stopped = subprocess.run([sys.executable, "-c", CTRL_C_AT_STEP_3 + launch], cwd=REPO, capture_output=True,
                             text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
                             start_new_session=True)  # fmt: skip
    assert stopped.returncode == EXIT_INTERRUPTED, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "Interrupted by Ctrl-C at step 4; checkpoint written" in stopped.stdout
    assert [path.name for path in list_checkpoints(run_dir / "checkpoints")] == ["checkpoint-4"]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"  # it said "preempted"
    started_with = (run_dir / ".hydra" / "overrides.yaml").read_text()

    monkeypatch.chdir(tmp_path)  # where Hydra would make a new outputs/DATE/TIME folder
    try:
        with one_thread():
            resumed = run_here(["train.py", f"trainer.resume={run_dir}"])
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"Continuing {run_dir}" in resumed.stdout and not (tmp_path / "outputs").exists()
        assert [r["loss"] for r in read_metrics(run_dir)] == [r["loss"] for r in read_metrics(straight)]  # bit for bit
        recorded = OmegaConf.load(run_dir / "config.yaml")
        assert (recorded.trainer.batch_size, recorded.data.length, recorded.trainer.max_steps) == (8, 64, STEPS)
        assert (run_dir / ".hydra" / "overrides.yaml").read_text() == started_with  # how the run started, kept

        before = digest(run_dir)
        refused = run_here(["train.py", f"trainer.resume={run_dir}", "trainer.max_steps=0"])
        assert refused.returncode == 2 and "`trainer.max_steps` is 0" in refused.stderr
        assert digest(run_dir) == before and not (tmp_path / "outputs").exists()
    finally:
        register_configs()  # the resumed run's config took the schema's place in Hydra's ConfigStore
