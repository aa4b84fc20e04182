"""A moving window in a real GRPO run (``train.py`` from a finished tiny shapes run, on the CPU): its position is
logged each epoch and kept in the checkpoint, and a resumed run places, rolls out and trains exactly what the
uninterrupted one did; a fixed window's checkpoints hold no window state, as before."""

import json
from pathlib import Path

import pytest

from ..conftest import grpo_overrides, read_metrics, run_here, train_here

WEIGHTS = "checkpoints/checkpoint-4/transformer/diffusion_pytorch_model.safetensors"
# A 1-step window within the first 3 of the 4 sampler steps: starts 0, 1 or 2; the random one finishes its images in
# one step from the window's end (a compressed tail: what it rolls out depends on where the window sat).
WINDOWS = {
    "fixed": ["grpo.sde_steps=1", "grpo.sde_start=1"],
    "random": [
        "grpo.sde_window=random",
        "grpo.sde_steps=1",
        "grpo.window_range=3",
        "grpo.shared_prefix=true",
        "grpo.tail_steps=1",
    ],
    "sliding": ["grpo.sde_window=sliding", "grpo.sde_steps=1", "grpo.window_range=3", "grpo.slide_every=1"],
}


def train_grpo(init_dir: Path, run_dir: Path, window: str, *extra: str, epochs: int = 4) -> None:
    overrides = grpo_overrides(init_dir, *WINDOWS[window], *extra, epochs=epochs)
    result = run_here(["train.py", f"hydra.run.dir={run_dir}", *overrides])
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="module")
def init_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("window_init") / "run"
    train_here(run_dir, "trainer.max_steps=10", "trainer.checkpoint_every=10", "trainer.sample_every=0")
    return run_dir


@pytest.fixture(scope="module")
def straight_runs(init_run, tmp_path_factory) -> dict[str, Path]:
    """4 uninterrupted epochs of each window kind, a checkpoint every 2."""
    runs = {}
    for window in WINDOWS:
        runs[window] = tmp_path_factory.mktemp(f"window_{window}") / "run"
        train_grpo(init_run, runs[window], window)
    return runs


@pytest.mark.slow
def test_the_window_is_logged_and_checkpointed_where_it_sat(straight_runs):
    """random: starts drawn within the range; sliding: 0, 1, 2, 0; each checkpoint's grpo_window.json holds the
    epochs placed and the last start. A fixed window logs and saves nothing of the kind."""
    starts = {}
    for window in ("random", "sliding"):
        records = read_metrics(straight_runs[window])
        starts[window] = [r["rollout/window_start"] for r in records]
        for step in (2, 4):
            saved = json.loads((straight_runs[window] / f"checkpoints/checkpoint-{step}/grpo_window.json").read_text())
            assert saved == {"epoch": step, "start": starts[window][step - 1]}
    assert set(starts["random"]) <= {0, 1, 2} and len(set(starts["random"])) > 1
    assert starts["sliding"] == [0, 1, 2, 0]
    fixed = straight_runs["fixed"]
    assert all("rollout/window_start" not in r for r in read_metrics(fixed))
    assert not list(fixed.glob("checkpoints/*/grpo_window.json"))


@pytest.mark.slow
@pytest.mark.parametrize("window", ["random", "sliding"])
def test_a_resumed_run_with_a_moving_window_matches_the_uninterrupted_one(straight_runs, init_run, tmp_path, window):
    run_dir = tmp_path / "resumed"
    train_grpo(init_run, run_dir, window, epochs=2)
    train_grpo(init_run, run_dir, window, "trainer.resume=latest")
    straight, resumed = read_metrics(straight_runs[window]), read_metrics(run_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for key in ("rollout/window_start", "loss", "rollout/reward_mean", "grad_norm"):
        assert [r[key] for r in resumed] == [r[key] for r in straight], key
    assert (run_dir / WEIGHTS).read_bytes() == (straight_runs[window] / WEIGHTS).read_bytes()
