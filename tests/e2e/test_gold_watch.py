"""The watch on reward hacking run end to end: a DiffusionNFT run trained on ``jpeg_compressibility`` alone (a
reward images can game by losing their detail) with a gold reward it never trains on (``toy_rewards:IMAGE_DETAIL``,
the pixels' spread, from tests/plugins) read on a held-out prompt. The gold falls while the training reward on the
same images rises, the stop rule ends the run with a checkpoint, the best-gold checkpoint outlives pruning and is what
``scripts/evaluate.py RUN checkpoint=best_gold`` reads; a resumed run judges exactly as the uninterrupted one."""

import json
from pathlib import Path

import pytest

from ..conftest import REPO, nft_overrides, read_metrics, run_here, train_here

pytestmark = pytest.mark.slow  # train.py runs

GOLD = "gold/toy_rewards:IMAGE_DETAIL"
WATCH = [
    "~reward.weights.shapes_alignment",
    "~reward.weights.shapes_margin",
    "+reward.weights.jpeg_compressibility=1.0",
    "nft.gold_reward=toy_rewards:IMAGE_DETAIL",
    "nft.gold_prompts=[a yellow circle]",
    "nft.gold_every=3",
    "nft.gold_stop_margin=0.005",
    "nft.group_size=8",
    "nft.rollout_batch_size=16",
    "optim.lr=1e-3",
    "nft.kl_weight=0",
    "trainer.ema_decay=0",
    "trainer.checkpoint_every=6",
    "trainer.checkpoints_total_limit=1",
]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    """A tiny shapes run trained long enough (150 steps) to draw shapes with some detail."""
    run_dir = tmp_path_factory.mktemp("gold_base") / "run"
    train_here(run_dir, "trainer.max_steps=150", "trainer.checkpoint_every=150", "trainer.sample_every=0")
    return run_dir


def watch(base: Path, run_dir: Path, *extra: str, epochs: int = 15) -> None:
    overrides = nft_overrides(base, *WATCH, *extra, epochs=epochs)
    result = run_here(["train.py", f"hydra.run.dir={run_dir}", *overrides])
    assert result.returncode == 0, result.stderr[-4000:]


def timeless(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if "per_sec" not in k and "seconds" not in k} for r in records]


def test_the_watch_stops_a_gamed_run_and_keeps_its_best_gold_checkpoint(base_run, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "tests" / "plugins"))
    run = tmp_path / "run"
    watch(base_run, run)
    readings = [r for r in read_metrics(run) if GOLD in r]
    best = max(readings, key=lambda r: r[GOLD])
    last = readings[-1]
    assert last["step"] < 15  # stopped before max_steps
    assert last[GOLD] <= best[GOLD] - 0.005 and last["gold/training_reward"] > best["gold/training_reward"]
    assert all(r["gold/best_step"] == best["step"] for r in readings if r["step"] >= best["step"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "stopped early" and summary["steps"] == last["step"]
    assert f"below its best {best[GOLD]:.4f} at step {best['step']}" in summary["stop_reason"]
    kept = f"checkpoints/checkpoint-{best['step']}"
    assert summary["kept_checkpoints"] == {"best_gold": kept}
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("checkpoint-*"))
    assert checkpoints == sorted({f"checkpoint-{best['step']}", f"checkpoint-{last['step']}"})  # limit 1 + kept

    out = tmp_path / "eval"
    result = run_here(["scripts/evaluate.py", str(run), "checkpoint=best_gold", "images_per_prompt=2", "steps=4",
                       "prompt_file=null", "prompts=[a red circle]", f"out_dir={out}"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["arguments"]["checkpoint"] == str((run / kept).resolve())

    cut = tmp_path / "cut"
    watch(base_run, cut, epochs=6)
    watch(base_run, cut, "trainer.resume=latest")
    assert timeless(read_metrics(cut)) == timeless(read_metrics(run))
    assert json.loads((cut / "summary.json").read_text())["kept_checkpoints"] == {"best_gold": kept}
