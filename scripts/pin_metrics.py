"""Pin what short runs of each kind log, to show that a refactoring changed nothing: record the metrics of short SFT
(epsilon), flow-matching, DP-SGD, class-conditional DiT, GRPO and DiffusionNFT runs at one commit, then check them at
another.

    python scripts/pin_metrics.py record pinned.json      # before the change
    python scripts/pin_metrics.py check pinned.json       # after it: exit 0 when every pinned value is bit-identical

Each run is ``train.py`` in its own process with one thread (``OMP_NUM_THREADS=1``: a thread count changes float
sums), so the file holds on the machine and torch build that wrote it; it records both and ``check`` refuses
another. Every value of every ``metrics.jsonl`` record counts except timings (seconds, images per second). About
two minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SHORT = ["trainer.log_every=1", "trainer.sample_every=0", "trainer.seed=3", "monitor.reward.enabled=false"]
SHAPES = ["data.length=128", "trainer.batch_size=16", "model.num_layers=2", "trainer.max_steps=6", *SHORT]
VALIDATED = ["validation.every_n_steps=3", "validation.split=0.0625", "validation.timesteps=4"]
RUNS: dict[str, list[str]] = {
    "sft": ["+experiment=shapes", *SHAPES, *VALIDATED, "trainer.checkpoint_every=6"],
    "flow": ["+experiment=shapes_flow", *SHAPES, *VALIDATED],
    "dp": ["+experiment=shapes_dp", *SHAPES, "trainer.batch_size=32"],
    "class_conditional": [
        "+experiment=dit_digits",
        "data.path={digits}",
        "trainer.batch_size=32",
        "trainer.max_steps=6",
        "model.num_layers=2",
        *SHORT,
    ],
    # 3 epochs from the sft run: 2 prompts x 4 images, a 4-step sampler, every step but the last trained
    "grpo": [
        "+experiment=shapes_grpo",
        "trainer.init_from={sft}",
        "grpo.prompts=[a red circle,a blue square]",
        "grpo.prompt_file=null",
        "grpo.prompts_per_epoch=2",
        "grpo.group_size=4",
        "grpo.sample_steps=4",
        "grpo.sde_steps=null",
        "grpo.rollout_batch_size=8",
        "diffusion.sample_steps=4",
        "trainer.max_steps=3",
        *SHORT,
    ],
    # 3 epochs of DiffusionNFT from the sft run: 2 prompts x 4 images, 2 of a 4-step sampler's timesteps trained
    "nft": [
        "+experiment=shapes_nft",
        "trainer.init_from={sft}",
        "nft.prompts=[a red circle,a blue square]",
        "nft.prompt_file=null",
        "nft.prompts_per_epoch=2",
        "nft.group_size=4",
        "nft.sample_steps=4",
        "nft.steps_per_sample=2",
        "nft.rollout_batch_size=8",
        "diffusion.sample_steps=4",
        "trainer.max_steps=3",
        *SHORT,
    ],
}


def logged_values(run_dir: Path) -> list[dict]:
    """Every record of the run's metrics.jsonl, timings aside (they differ from run to run)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if "seconds" not in k and "per_sec" not in k} for r in records]


def run_all(root: Path) -> dict[str, list[dict]]:
    """Each run of ``RUNS`` in ``root``, in order (GRPO starts from the SFT run); their logged values."""
    subprocess.run([sys.executable, "scripts/make_digits.py", str(root / "digits")], cwd=REPO, check=True,
                   capture_output=True)  # fmt: skip
    places = {"digits": root / "digits", "sft": root / "sft"}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    values = {}
    for name, overrides in RUNS.items():
        argv = [item.format(**places) for item in overrides]
        print(f"{name}: python train.py {' '.join(argv)}", flush=True)
        result = subprocess.run([sys.executable, "train.py", *argv, f"hydra.run.dir={root / name}"], cwd=REPO,
                                env=env, capture_output=True, text=True)  # fmt: skip
        if result.returncode != 0:
            sys.exit(f"the {name} run failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
        values[name] = logged_values(root / name)
    return values


def where() -> dict[str, str]:
    """What the values hold on: this machine's processor (its model name, where Linux gives one) and torch build."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.partition(":")[2].strip() for line in lines if line.startswith("model name")]
    processor = names[0] if names else platform.processor()
    return {"machine": f"{platform.machine()} {processor}", "torch": torch.__version__}


def differences(pinned: dict[str, list[dict]], now: dict[str, list[dict]]) -> list[str]:
    """Every pinned value that differs or is gone, as ``run step key: pinned -> now`` (values logged now that were
    not then are new metrics, not changes: ``added``)."""
    found = []
    for name, records in pinned.items():
        current = now.get(name, [])
        if len(current) != len(records):
            found.append(f"{name}: {len(records)} records pinned, {len(current)} now")
        for before, after in zip(records, current):
            for key in sorted(before):
                if before[key] != after.get(key):
                    found.append(f"{name} step {before.get('step')} {key}: {before[key]} -> {after.get(key)}")
    return found


def added(pinned: dict[str, list[dict]], now: dict[str, list[dict]]) -> list[str]:
    """The metrics logged now that the pin has not, as ``run: key, ...``."""
    new = {name: sorted({key for r in now.get(name, []) for key in r} - {key for r in records for key in r})
           for name, records in pinned.items()}  # fmt: skip
    return [f"{name}: {', '.join(keys)}" for name, keys in new.items() if keys]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument("file", type=Path)
    args = parser.parse_args(argv)
    if args.action == "check":
        pinned = json.loads(args.file.read_text())
        if pinned["where"] != where():
            sys.exit(f"{args.file} was recorded on {pinned['where']}, this is {where()}: record and check on one")
    with tempfile.TemporaryDirectory() as folder:
        values = run_all(Path(folder))
    if args.action == "record":
        args.file.write_text(json.dumps({"where": where(), "runs": values}, indent=1) + "\n")
        print(f"Pinned {sum(map(len, values.values()))} records of {len(values)} runs in {args.file}")
        return 0
    found = differences(pinned["runs"], values)
    print("\n".join(found[:40]) if found else f"All {sum(map(len, values.values()))} records bit-identical.")
    for line in added(pinned["runs"], values):
        print(f"added since the pin: {line}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
