"""The reward curve of reward fine-tuning runs, side by side: the reward monitor's ``reward/mean`` (the EMA weights on
the monitor's fixed prompts and seeds) against the seconds the run had trained by then, monitors and checkpoint writes
left out, so runs with different monitor cadences compare.

    python scripts/reward_curve.py outputs/GRPO_RUN outputs/NFT_RUN

Prints one table per run, then, for each run after the first, how long it took to reach the first run's final
reward and what fraction of the first run's training time that is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dit_trainer.training.metrics import MetricsFile


def reward_curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, training seconds by then, reward/mean) at every step the reward monitor logged."""
    elapsed, curve, previous = 0.0, [], 0
    for record in MetricsFile(run_dir / "metrics.jsonl").read():
        if "seconds_per_step" in record:  # the mean over the steps since the previous log line
            elapsed += record["seconds_per_step"] * (record["step"] - previous)
            previous = record["step"]
        if "reward/mean" in record:
            curve.append((record["step"], elapsed, record["reward/mean"]))
    return curve


def seconds_to_reach(curve: list[tuple[int, float, float]], reward: float) -> float | None:
    return next((seconds for _, seconds, value in curve if value >= reward), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    args = parser.parse_args()
    if missing := [str(run) for run in args.runs if not (run / "metrics.jsonl").is_file()]:
        parser.error(f"no metrics.jsonl in {', '.join(missing)}: pass run folders train.py wrote (outputs/DATE/TIME)")
    curves = {run: reward_curve(run) for run in args.runs}
    for run, curve in curves.items():
        print(f"\n{run}\n  {'step':>6} {'train s':>9} {'reward/mean':>12}")
        for step, seconds, reward in curve:
            print(f"  {step:>6} {seconds:>9.1f} {reward:>12.4f}")
    baseline, *others = args.runs
    if not curves[baseline]:
        print(f"\n{baseline} logged no reward/mean", file=sys.stderr)
        return 1
    _, total, final = curves[baseline][-1]
    print(f"\n{baseline}: final reward/mean {final:.4f} after {total:.0f} s of training")
    for run in others:
        reached = seconds_to_reach(curves[run], final)
        verdict = "never" if reached is None else f"after {reached:.0f} s ({reached / total:.2f} of its time)"
        print(f"{run}: reaches it {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
