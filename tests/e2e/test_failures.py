"""``train.py`` runs that fail: a NaN is skipped, then stops the run with a report (exit 4); when one rank of two fails,
both stop with its message and the job gets its exit code back from the run folder (``failures.py``)."""

import subprocess
import sys
import time

import pytest

from dit_trainer.errors import EXIT_CHECKPOINT_FAILED, EXIT_NONFINITE

from ..conftest import QUIET, REPO, TINY_SHAPES, free_port, read_metrics, run_script


@pytest.mark.slow
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
    records = read_metrics(run_dir)
    assert [r["skipped_steps"] for r in records] == [0, 1, 2]


PLANT = """
import runpy, sys
from dit_trainer.training.state import checkpoint
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
    port = free_port()
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
    command = [sys.executable, "-m", "dit_trainer.runs.failures", str(run_dir), "--since", str(launched)]
    code = subprocess.run(command, cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert code == str(EXIT_CHECKPOINT_FAILED)


@pytest.mark.slow
def test_a_start_refused_under_two_processes_is_printed_and_puts_the_folders_launch_record_back(tmp_path):
    """The failing process recorded its failure and lingered first: torchrun ended it before it printed its error or
    put back the record its launch wrote over, and the other process left through the watch, which did neither."""
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    record = {name: f"the run's {name}" for name in ("config.yaml", "hydra.yaml", "overrides.yaml")}
    for name, text in record.items():
        (run_dir / ".hydra" / name).write_text(text)
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--master_port", str(free_port())]
    result = subprocess.run(
        [sys.executable, *launch, "train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", "data=imagefolder",
         f"data.path={tmp_path / 'no_such_folder'}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "`data.path`" in output and "no metadata.jsonl was found there" in output
    assert {path.name: path.read_text() for path in (run_dir / ".hydra").iterdir()} == record
