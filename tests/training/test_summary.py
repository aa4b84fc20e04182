"""The end of a run (``training/summary.py``): ``summary.json`` and the closing log line, drawn from the whole run's
``metrics.jsonl`` records, for a finished run, one stopped by preemption and one resumed with nothing left to train."""

from __future__ import annotations

import json
from pathlib import Path

from dit_trainer.runs.run_summary import write_summary
from dit_trainer.training.summary import RunEnd, summarize, summary_line

RECORDS = [
    {"step": 10, "loss": 0.9, "val/loss": 0.80, "reward/mean": 0.25},
    {"step": 20, "loss": 0.7, "val/loss": 0.60},
    {"step": 30, "loss": 0.6, "val/loss": 0.65, "reward/mean": 0.5},
]


def test_a_finished_run_summarizes_the_whole_run(tmp_path):
    weights = tmp_path / "checkpoints" / "checkpoint-30" / "transformer_ema"
    end = RunEnd("completed", 30, 30, 20, seconds=5.0, monitor_seconds=1.0, weights=weights)
    summary = summarize(RECORDS, end, tmp_path)
    assert summary == {
        "status": "completed",
        "steps": 30,
        "max_steps": 30,
        "resumed_at_step": 20,
        "seconds": 5.0,
        "seconds_per_step": 0.5,  # 10 steps in this launch
        "monitor_seconds": 1.0,
        "final_loss": 0.6,
        "final_loss_step": 30,
        "final_val_loss": 0.65,
        "best_val_loss": {"step": 20, "value": 0.6},  # an earlier launch's, from metrics.jsonl
        "final_reward": {"step": 30, "value": 0.5},
        "weights": str(Path("checkpoints/checkpoint-30/transformer_ema")),
        "stop_reason": None,
        "kept_checkpoints": {},
    }
    assert json.loads(write_summary(summary, tmp_path).read_text()) == summary
    line = summary_line(summary, tmp_path)
    assert line.startswith("Trained 30 steps in 5 s (0.500 s/step, resumed at step 20), final loss 0.6000")
    assert "val loss 0.6500 (best 0.6000 at step 20), reward 0.500; monitors took 1.0 s (20.0% of it)" in line


def test_a_preempted_run_says_where_it_stopped_with_what_it_has(tmp_path):
    grpo = [{"step": 4, "loss": 0.1, "rollout/reward_mean": 0.75}]  # GRPO's rollout reward when no monitor ran
    summary = summarize(grpo, RunEnd("preempted", 4, 100, 0, 8.0, 0.0, None), tmp_path)
    assert summary["status"] == "preempted" and summary["final_reward"] == {"step": 4, "value": 0.75}
    assert summary["best_val_loss"] is None and summary["weights"] is None and summary["resumed_at_step"] is None
    assert summary_line(summary, tmp_path).startswith("Stopped at step 4 of 100 (preempted) after 8 s")
    between_logs = summarize(RECORDS, RunEnd("preempted", 34, 100, 0, 8.0, 0.0, None), tmp_path)
    assert between_logs["final_loss_step"] == 30
    assert "final loss 0.6000 (logged at step 30)" in summary_line(between_logs, tmp_path)


def test_a_run_a_monitor_stopped_says_why_and_which_checkpoint_it_kept(tmp_path):
    kept = {"best_gold": tmp_path / "checkpoints" / "checkpoint-20"}
    end = RunEnd("stopped early", 30, 100, 0, 8.0, 1.0, None, "the gold reward fell", kept)
    summary = summarize(RECORDS, end, tmp_path)
    assert summary["stop_reason"] == "the gold reward fell"
    assert summary["kept_checkpoints"] == {"best_gold": str(Path("checkpoints/checkpoint-20"))}
    line = summary_line(summary, tmp_path)
    assert line.startswith("Stopped at step 30 of 100 (stopped early) after 8 s")
    assert f"stopped because the gold reward fell, kept {Path('checkpoints/checkpoint-20')} as `best_gold`" in line


def test_a_resume_at_max_steps_says_nothing_was_trained_and_what_to_raise(tmp_path):
    """A finished run requeued used to end with only "(no steps)" (one resumed past it is refused: test_trainer)."""
    summary = summarize(RECORDS, RunEnd("completed", 30, 30, 30, 0.1, 0.0, None), tmp_path)
    assert summary_line(summary, tmp_path).startswith(
        "Trained 30 steps in 0 s (none trained: it resumed at step 30, its `trainer.max_steps`; raise that to train on)"
    )
    fresh = summarize([], RunEnd("stopped: KeyboardInterrupt", 0, 10, 0, 0.1, 0.0, None), tmp_path)
    assert "(no steps)" in summary_line(fresh, tmp_path)
