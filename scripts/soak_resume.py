"""Soak test of what a run survives: kill a shapes run with SIGKILL at random moments (during start-up, training and
checkpoint writes), resume it with ``trainer.resume=latest`` each time, and check that nothing is lost.

    python scripts/soak_resume.py                       # 20 kills, 200 steps, in a temporary folder
    python scripts/soak_resume.py --kills 5 --steps 120 --out /tmp/soak
    python scripts/soak_resume.py --grpo --kills 10 --steps 12   # a GRPO run (12 epochs) from a short shapes run
    python scripts/soak_resume.py --nft --kills 10 --steps 12    # a DiffusionNFT run, likewise

After every kill each ``checkpoint-N`` folder must be complete and readable (a write that was cut short may only
leave a ``.checkpoint-N.partial``, which resuming removes). At the end every value the soaked run logged
(metrics.jsonl, every step; timings aside) must equal that of one uninterrupted run with the same seed. A GRPO or NFT
run is also killed during its rollouts and during its policy updates. Exit code 0 when all holds, 1 otherwise.
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
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from dit_trainer.runs.run_folder import CHECKPOINTS, checkpoint_step, incomplete_reason, list_checkpoints
from dit_trainer.training.metrics import MetricsFile

REPO = Path(__file__).resolve().parents[1]
LOGGED = ["trainer.log_every=1", "trainer.sample_every=0", "trainer.seed=3", "monitor.reward.enabled=false"]
SHAPES = ["+experiment=shapes", "data.length=256", "trainer.batch_size=16", "model.num_layers=2", *LOGGED]
# 2 captions x 8 images an epoch, a 4-step sampler; the model, data and diffusion settings are the init run's.
GRPO = [
    "+experiment=shapes_grpo",
    "grpo.prompts=[a red circle,a blue square]",
    "grpo.prompt_file=null",
    "grpo.prompts_per_epoch=2",
    "grpo.group_size=8",
    "grpo.sample_steps=4",
    "grpo.sde_steps=null",
    "grpo.rollout_batch_size=16",
    "grpo.beta=0.04",
    "diffusion.sample_steps=4",
    *LOGGED,
]


# The same, for DiffusionNFT: each image trains 2 of the sampler's 3 timesteps, drawn (the draws must resume too).
NFT = [
    "+experiment=shapes_nft",
    "nft.prompts=[a red circle,a blue square]",
    "nft.prompt_file=null",
    "nft.prompts_per_epoch=2",
    "nft.group_size=8",
    "nft.sample_steps=4",
    "nft.steps_per_sample=2",
    "nft.rollout_batch_size=16",
    "diffusion.sample_steps=4",
    *LOGGED,
]


@dataclass(frozen=True)
class Soak:
    """What is soaked: its overrides, its checkpoint interval and how far past a resume a kill may come (in steps),
    and the moments it is killed at."""

    overrides: list[str]
    checkpoint_every: int
    steps_ahead: int
    moments: tuple[str, ...]


SHAPES_SOAK = Soak(SHAPES, 10, 25, ("during start-up", "while training", "during a checkpoint write"))
ONLINE_MOMENTS = ("during start-up", "during rollouts", "during an update", "during a checkpoint write")


def launch(run_dir: Path, steps: int, log, soak: Soak) -> subprocess.Popen:
    command = [sys.executable, "train.py", *soak.overrides, f"trainer.max_steps={steps}", f"hydra.run.dir={run_dir}"]
    command += [f"trainer.checkpoint_every={soak.checkpoint_every}", "trainer.checkpoints_total_limit=3"]
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


def logged_step(run_dir: Path, since: float) -> int:
    """The last step in metrics.jsonl (the loop logs every step here), once the file was written after ``since``
    (before, it may hold a killed attempt's steps past the checkpoint, which resuming removes)."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists() or metrics.stat().st_mtime < since:
        return 0
    records = MetricsFile(metrics).read()
    return records[-1]["step"] if records else 0


def kill_at_a_random_moment(
    process: subprocess.Popen, run_dir: Path, rng: random.Random, soak: Soak, phases: tuple[float, float]
) -> str:
    """SIGKILL ``process`` at a random moment of a random phase: start-up (imports, models, resume), training (1 to
    ``steps_ahead`` steps after the resumed one; for GRPO, a random time into that epoch's rollouts or its update,
    ``phases`` being their seconds), or the first or second checkpoint write; returns the phase, or 'finished' if
    the run ended first. Moments in steps, not seconds, so that runs progress on a slow or busy machine."""
    moment = rng.choice(soak.moments)
    resumed = max((checkpoint_step(p) for p in list_checkpoints(run_dir / CHECKPOINTS)), default=0)
    launched, delay = time.time(), rng.uniform(1.0, 6.0)
    steps, writes = rng.randint(1, soak.steps_ahead), rng.randint(1, 2)
    rollouts, update = phases
    into_epoch = rng.uniform(0, rollouts) if moment == "during rollouts" else rollouts + rng.uniform(0, update)
    epoch_began = None
    while process.poll() is None:
        if moment == "during start-up":
            due = time.time() > launched + delay
        elif moment == "while training":
            due = logged_step(run_dir, since=launched) >= resumed + steps
        elif moment in ("during rollouts", "during an update"):
            if epoch_began is None and logged_step(run_dir, since=launched) >= resumed + steps - 1:
                epoch_began = time.time()  # the epoch after that log line has begun: rollouts first, then the update
            due = epoch_began is not None and time.time() > epoch_began + into_epoch
        else:
            partials = (run_dir / CHECKPOINTS).glob(".checkpoint-*.partial")
            due = any(
                int(p.name.split("-")[1].split(".")[0]) >= resumed + writes * soak.checkpoint_every for p in partials
            )
            time.sleep(rng.uniform(0.0, 0.2) if due else 0.0)
        if due:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return moment
        time.sleep(0.01)
    return "finished"


def logged(run_dir: Path) -> dict[int, dict]:
    """Every logged value by step, timings aside (they differ from run to run)."""
    return {
        record["step"]: {k: v for k, v in record.items() if "seconds" not in k and "per_sec" not in k}
        for record in MetricsFile(run_dir / "metrics.jsonl").read()
    }


def epoch_phases(reference: Path) -> tuple[float, float]:
    """The median seconds of an online method's epoch's rollouts and of its update, from the uninterrupted run (0, 0
    for a training run)."""
    records = MetricsFile(reference / "metrics.jsonl").read()
    phases = [sorted(r.get(key, 0.0) for r in records) for key in ("rollout/seconds", "policy/seconds")]
    return phases[0][len(records) // 2], phases[1][len(records) // 2]


def soak_run(out: Path, kills: int, steps: int, seed: int, soak: Soak) -> bool:
    rng = random.Random(seed)
    reference, soaked = out / "reference", out / "soaked"
    with (out / "log.txt").open("a") as log:
        print(f"Uninterrupted reference run ({steps} steps) ...", flush=True)
        if launch(reference, steps, log, soak).wait() != 0:
            print(f"The reference run failed; see {out / 'log.txt'}")
            return False
        phases = epoch_phases(reference)
        start, problems, moments = time.monotonic(), [], []
        for attempt in range(1, kills + 1):
            moment = kill_at_a_random_moment(launch(soaked, steps, log, soak), soaked, rng, soak, phases)
            found = unreadable_checkpoints(soaked)
            complete = [p.name for p in list_checkpoints(soaked / CHECKPOINTS)]
            print(f"kill {attempt:2d} {moment:25s} -> complete: {', '.join(complete) or 'none'}", flush=True)
            problems += [f"after kill {attempt}: {p}" for p in found]
            moments.append(moment)
            if moment == "finished":
                break
        resumed_from = max((checkpoint_step(p) for p in list_checkpoints(soaked / CHECKPOINTS)), default=0)
        code = launch(soaked, steps, log, soak).wait()
    expected, got = logged(reference), logged(soaked)
    mismatched = [step for step in expected if got.get(step) != expected[step]]
    counts = ", ".join(f"{moments.count(moment)} {moment}" for moment in soak.moments)
    print(
        f"\nKills: {counts}, in {time.monotonic() - start:.0f} s; last resume from step {resumed_from}; final attempt "
        f"exit code {code}."
    )
    print(f"Unreadable checkpoint folders: {len(problems)}", *problems, sep="\n  ")
    print(f"Steps with a logged value that differs from the uninterrupted run: {len(mismatched)} of {len(expected)}")
    return code == 0 and not problems and not mismatched and len(got) == steps


def train_init_run(out: Path) -> Path:
    """The finished shapes run a GRPO or NFT soak starts from (20 steps, its EMA weights checkpointed)."""
    init = out / "init"
    if not list_checkpoints(init / CHECKPOINTS):
        command = [sys.executable, "train.py", *SHAPES, "trainer.max_steps=20", f"hydra.run.dir={init}"]
        subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    return init


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=None, help="default: 200 (GRPO, NFT: 12 epochs)")
    parser.add_argument("--seed", type=int, default=0, help="of the kill moments")
    online = parser.add_mutually_exclusive_group()
    online.add_argument("--grpo", action="store_true", help="soak a GRPO run started from a short shapes run")
    online.add_argument("--nft", action="store_true", help="soak a DiffusionNFT run started from a short shapes run")
    parser.add_argument("--out", type=Path, default=None, help="default: a new temporary folder")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="soak-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"Soak test in {out}")
    soak, steps = SHAPES_SOAK, args.steps or 200
    if args.grpo or args.nft:
        overrides = GRPO if args.grpo else NFT
        soak = Soak([*overrides, f"trainer.init_from={train_init_run(out)}"], 2, 3, ONLINE_MOMENTS)
        steps = args.steps or 12
    return 0 if soak_run(out, args.kills, steps, args.seed, soak) else 1


if __name__ == "__main__":
    sys.exit(main())
