"""Soak test of what a run survives: kill a shapes run with SIGKILL at random moments (during start-up, training and
checkpoint writes), resume it with ``trainer.resume=latest`` each time, and check that nothing is lost.

    python scripts/soak_resume.py                       # 20 kills, 200 steps, in a temporary folder
    python scripts/soak_resume.py --kills 5 --steps 120 --out /tmp/soak

After every kill each ``checkpoint-N`` folder must be complete and readable (a write that was cut short may only
leave a ``.checkpoint-N.partial``, which resuming removes). At the end the soaked run's losses (metrics.jsonl, every
step) must equal those of one uninterrupted run with the same seed. Exit code 0 when all holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from dit_trainer.run_folder import CHECKPOINTS, checkpoint_step, incomplete_reason, list_checkpoints
from dit_trainer.training.metrics import MetricsFile

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT_EVERY = 10
RUN = [
    "+experiment=shapes",
    "data.length=256",
    "trainer.batch_size=16",
    "model.num_layers=2",
    "trainer.log_every=1",
    f"trainer.checkpoint_every={CHECKPOINT_EVERY}",
    "trainer.checkpoints_total_limit=3",
    "trainer.sample_every=0",
    "trainer.seed=3",
    "monitor.grpo.enabled=false",
]


def launch(run_dir: Path, steps: int, log) -> subprocess.Popen:
    command = [sys.executable, "train.py", *RUN, f"trainer.max_steps={steps}", f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(
        [*command, "trainer.resume=latest"], cwd=REPO, stdout=log, stderr=log, start_new_session=True
    )


def unreadable_checkpoints(run_dir: Path) -> list[str]:
    """Every ``checkpoint-N`` folder that is incomplete or holds a file that does not load."""
    problems = []
    for folder in sorted((run_dir / CHECKPOINTS).glob("checkpoint-*")):
        reason = incomplete_reason(folder)
        if reason is None:
            try:
                for file in folder.rglob("*"):
                    if file.suffix == ".safetensors":
                        load_file(file)
                    elif file.suffix == ".bin":
                        torch.load(file, weights_only=True)
                    elif file.suffix == ".json":
                        json.loads(file.read_text(encoding="utf-8"))
            except Exception as error:  # noqa: BLE001 - any failure to load is what this looks for
                reason = f"{type(error).__name__}: {error}"
        if reason is not None:
            problems.append(f"{folder.name}: {reason}")
    return problems


MOMENTS = ("during start-up", "while training", "during a checkpoint write")


def logged_step(run_dir: Path, since: float) -> int:
    """The last step in metrics.jsonl (the loop logs every step here), once the file was written after ``since``
    (before, it may hold a killed attempt's steps past the checkpoint, which resuming removes)."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists() or metrics.stat().st_mtime < since:
        return 0
    records = MetricsFile(metrics).read()
    return records[-1]["step"] if records else 0


def kill_at_a_random_moment(process: subprocess.Popen, run_dir: Path, rng: random.Random) -> str:
    """SIGKILL ``process`` at a random moment of a random phase: start-up (imports, models, resume), training (1 to
    25 steps after the resumed one), or the first or second checkpoint write; returns the phase, or 'finished' if
    the run ended first. Moments in steps, not seconds, so that runs progress on a slow or busy machine."""
    moment = rng.choice(MOMENTS)
    resumed = max((checkpoint_step(p) for p in list_checkpoints(run_dir / CHECKPOINTS)), default=0)
    launched, delay = time.time(), rng.uniform(1.0, 6.0)
    steps, writes = rng.randint(1, 25), rng.randint(1, 2)
    while process.poll() is None:
        if moment == "during start-up":
            due = time.time() > launched + delay
        elif moment == "while training":
            due = logged_step(run_dir, since=launched) >= resumed + steps
        else:
            partials = (run_dir / CHECKPOINTS).glob(".checkpoint-*.partial")
            due = any(int(p.name.split("-")[1].split(".")[0]) >= resumed + writes * CHECKPOINT_EVERY for p in partials)
            time.sleep(rng.uniform(0.0, 0.2) if due else 0.0)
        if due:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return moment
        time.sleep(0.01)
    return "finished"


def losses(run_dir: Path) -> dict[int, float]:
    return {record["step"]: record["loss"] for record in MetricsFile(run_dir / "metrics.jsonl").read()}


def soak(out: Path, kills: int, steps: int, seed: int) -> bool:
    rng = random.Random(seed)
    reference, soaked = out / "reference", out / "soaked"
    with (out / "log.txt").open("a") as log:
        print(f"Uninterrupted reference run ({steps} steps) ...", flush=True)
        if launch(reference, steps, log).wait() != 0:
            print(f"The reference run failed; see {out / 'log.txt'}")
            return False
        start, problems, moments = time.monotonic(), [], []
        for attempt in range(1, kills + 1):
            moment = kill_at_a_random_moment(launch(soaked, steps, log), soaked, rng)
            found = unreadable_checkpoints(soaked)
            complete = [p.name for p in list_checkpoints(soaked / CHECKPOINTS)]
            print(f"kill {attempt:2d} {moment:25s} -> complete: {', '.join(complete) or 'none'}", flush=True)
            problems += [f"after kill {attempt}: {p}" for p in found]
            moments.append(moment)
            if moment == "finished":
                break
        resumed_from = max((checkpoint_step(p) for p in list_checkpoints(soaked / CHECKPOINTS)), default=0)
        code = launch(soaked, steps, log).wait()
    expected, got = losses(reference), losses(soaked)
    mismatched = [step for step in expected if got.get(step) != expected[step]]
    counts = ", ".join(f"{moments.count(moment)} {moment}" for moment in MOMENTS)
    print(
        f"\nKills: {counts}, in {time.monotonic() - start:.0f} s; last resume from step {resumed_from}; final attempt "
        f"exit code {code}."
    )
    print(f"Unreadable checkpoint folders: {len(problems)}", *problems, sep="\n  ")
    print(f"Steps whose loss differs from the uninterrupted run: {len(mismatched)} of {len(expected)}")
    return code == 0 and not problems and not mismatched and len(got) == steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="of the kill moments")
    parser.add_argument("--out", type=Path, default=None, help="default: a new temporary folder")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="soak-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"Soak test in {out}")
    return 0 if soak(out, args.kills, args.steps, args.seed) else 1


if __name__ == "__main__":
    sys.exit(main())
