"""The end of a run in one place: ``summary.json`` in the run folder and the line the log ends with.

Both are drawn from ``metrics.jsonl``, which holds the whole run (a resumed run's file continues the interrupted
one's), so the best validation loss is the best of the run, not of its last launch. The file is written atomically by
the main process whenever ``fit`` ends: done, preempted (with what the run has so far), or stopped by an error
(``run_summary.write_summary``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dit_trainer.runs.run_summary import SUMMARY

REWARD_KEYS = ("reward/mean", "rollout/reward_mean")  # the reward monitor's, else GRPO's rollouts'


@dataclass(frozen=True)
class RunEnd:
    """How a launch of the run ended: what ``metrics.jsonl`` cannot say."""

    # completed | stopped early (a monitor's verdict) | preempted (a signal) | interrupted (Ctrl-C) | stopped: <error>
    status: str
    steps: int  # the run's step now
    max_steps: int
    start_step: int  # the step this launch resumed at (0: a fresh run)
    seconds: float  # of this launch
    monitor_seconds: float
    weights: Path | None  # the newest checkpoint's weights (the EMA ones when kept)
    stop_reason: str | None = None  # why a monitor stopped the run early (status "stopped early")
    kept: dict[str, Path] | None = None  # checkpoints kept from pruning by name (``best_gold``)


def _last(records: list[dict], key: str) -> tuple[int, float] | None:
    found = [(record["step"], record[key]) for record in records if isinstance(record.get(key), (int, float))]
    return found[-1] if found else None


def summarize(records: list[dict], end: RunEnd, run_dir: Path) -> dict:
    """``summary.json``'s content: the run's end, its final training loss, final and best validation loss, final
    reward; paths relative to ``run_dir``."""
    trained = end.steps - end.start_step
    validation = [(record["step"], record["val/loss"]) for record in records if "val/loss" in record]
    best = min(validation, key=lambda pair: pair[1]) if validation else None
    loss, val = _last(records, "loss"), _last(records, "val/loss")
    reward = next((found for key in REWARD_KEYS if (found := _last(records, key))), None)
    return {
        "status": end.status,
        "steps": end.steps,
        "max_steps": end.max_steps,
        "resumed_at_step": end.start_step or None,
        "seconds": round(end.seconds, 1),
        "seconds_per_step": round(end.seconds / trained, 4) if trained > 0 else None,
        "monitor_seconds": round(end.monitor_seconds, 1),
        "final_loss": loss[1] if loss else None,
        "final_loss_step": loss[0] if loss else None,  # the last logged: a run stopped between logs ends later
        "final_val_loss": val[1] if val else None,
        "best_val_loss": {"step": best[0], "value": best[1]} if best else None,
        "final_reward": {"step": reward[0], "value": reward[1]} if reward else None,
        "weights": str(end.weights.relative_to(run_dir)) if end.weights else None,
        "stop_reason": end.stop_reason,
        "kept_checkpoints": {name: str(path.relative_to(run_dir)) for name, path in (end.kept or {}).items()},
    }


def summary_line(summary: dict, run_dir: Path) -> str:
    """``Trained 200 steps in 369 s (1.847 s/step), final loss 1.1693, val loss 0.7940 (best 0.7940 at step
    200), reward 0.594; monitors took 108.5 s (29.4% of it). Run folder: RUN (summary.json)``."""
    seconds, resumed_at, max_steps = summary["seconds"], summary["resumed_at_step"], summary["max_steps"]
    if summary["seconds_per_step"]:
        per_step = f"{summary['seconds_per_step']:.3f} s/step"
        per_step += f", resumed at step {resumed_at}" if resumed_at else ""
    elif resumed_at and resumed_at == max_steps:  # a finished run requeued (one past it is refused at its resume)
        per_step = f"none trained: it resumed at step {resumed_at}, its `trainer.max_steps`; raise that to train on"
    else:
        per_step = "no steps"
    if summary["status"] == "completed":
        parts = [f"Trained {summary['steps']} steps in {seconds:.0f} s ({per_step})"]
    else:
        ended = f"Stopped at step {summary['steps']} of {summary['max_steps']} ({summary['status']})"
        parts = [f"{ended} after {seconds:.0f} s ({per_step})"]
    if summary["final_loss"] is not None:
        logged_at = summary.get("final_loss_step")
        at = f" (logged at step {logged_at})" if logged_at not in (None, summary["steps"]) else ""
        parts.append(f"final loss {summary['final_loss']:.4f}{at}")
    if summary["final_val_loss"] is not None:
        best = summary["best_val_loss"]
        parts.append(f"val loss {summary['final_val_loss']:.4f} (best {best['value']:.4f} at step {best['step']})")
    if summary["final_reward"] is not None:
        parts.append(f"reward {summary['final_reward']['value']:.3f}")
    if summary.get("stop_reason"):
        parts.append(f"stopped because {summary['stop_reason']}")
    parts += [f"kept {path} as `{name}`" for name, path in (summary.get("kept_checkpoints") or {}).items()]
    share = 100 * summary["monitor_seconds"] / max(seconds, 1e-9)
    monitors = f"monitors took {summary['monitor_seconds']:.1f} s ({share:.1f}% of it)"
    return f"{', '.join(parts)}; {monitors}. Run folder: {run_dir} ({SUMMARY})"
