"""The GPU check: correctness, throughput (img/s, peak memory, MFU) and FSDP2 of this machine in one command.

    scripts/gpu_check.sh                                  # everything this machine can run
    scripts/gpu_check.sh --out outputs/gpu_check/h100 --models pixart_xl_2 --batches 64,128,256

Options: --out (default outputs/gpu_check/<date>/<time>), --models (pixart_xl_2,dit_xl_2), --batches (per process;
32,64,128 on a GPU, 4,8 on a CPU), --variants (eager,compile,checkpointing on a GPU; eager on a CPU), --steps and
--warmup (timed and warm-up steps per batch, 20 and 5), --train-steps (the tiny runs' steps, 50; 10 on a CPU),
--tiny (tiny models on a GPU too: a quick smoke run), --fsdp (the FSDP rows on a CPU too), --fsdp-config (an
accelerate config; accelerate_configs/fsdp.yaml on GPUs, fsdp_cpu.yaml on a CPU), --row-timeout (seconds, 1800).
Writes OUT/gpu_check.json and OUT/gpu_check.md (README: "The GPU check"); an OUT holding files no check wrote is
refused (exit 2), an earlier check's OUT is written again (its training runs kept, the new ones beside them). The
subcommands `throughput` and `train` are the rows' subprocesses.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from datetime import datetime
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(size) for size in text.split(","))


def _names(text: str) -> tuple[str, ...]:
    return tuple(name for name in text.split(",") if name)


def check(argv: list[str]) -> int:
    from dit_trainer.errors import ConfigError, exit_code
    from dit_trainer.gpu_check.plan import Options, run_check
    from dit_trainer.gpu_check.throughput import RECIPES, VARIANTS

    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=REPO / "outputs" / "gpu_check" / f"{datetime.now():%Y-%m-%d/%H-%M-%S}"
    )
    parser.add_argument("--models", type=_names, default=tuple(RECIPES))
    parser.add_argument("--batches", type=_sizes, default=(32, 64, 128) if cuda else (4, 8))
    parser.add_argument("--variants", type=_names, default=VARIANTS if cuda else ("eager",))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=50 if cuda else 10)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--fsdp-config", type=Path)
    parser.add_argument("--row-timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    unknown = [name for name in args.models if name not in RECIPES] + [v for v in args.variants if v not in VARIANTS]
    if unknown or args.train_steps < 2:
        parser.error(f"unknown models or variants {unknown} (models: {list(RECIPES)}, variants: {list(VARIANTS)})"
                     if unknown else "--train-steps must be at least 2 (half of them are resumed)")  # fmt: skip
    options = Options(
        REPO, args.out.resolve(), args.tiny or not cuda, args.models, args.batches, args.variants, args.warmup,
        args.steps, args.train_steps, args.fsdp, args.fsdp_config, args.row_timeout,
    )  # fmt: skip
    try:
        json_path, markdown_path = run_check(options)
    except ConfigError as error:  # an --out holding files the check did not write: refused, nothing written
        print(f"error: {error}", file=sys.stderr)
        return exit_code(error)
    print(markdown_path.read_text(encoding="utf-8"))
    print(f"Wrote {json_path} and {markdown_path}")
    return 0


def throughput(result: str, work: str, jobs: str) -> int:
    """A throughput row's subprocess: the jobs' results into ``result`` (on rank 0 of a launch)."""
    from dit_trainer.gpu_check.assets import write_assets
    from dit_trainer.gpu_check.throughput import Job, rank, run_jobs

    work_dir = Path(work)
    results = run_jobs([Job(**{**job, "batches": tuple(job["batches"])}) for job in json.loads(jobs)],
                       REPO / "configs", write_assets(work_dir / "assets"), work_dir)  # fmt: skip
    if rank() == 0:
        Path(result).parent.mkdir(parents=True, exist_ok=True)
        Path(result).write_text(json.dumps({"jobs": results}, indent=1), encoding="utf-8")
    return 0


def train(peak_file: str, overrides: list[str]) -> None:
    """A training row's subprocess: train.py with ``overrides``, its peak memory written to ``peak_file`` at exit."""
    from dit_trainer.gpu_check.rows import record_peak_memory_at_exit

    Path(peak_file).parent.mkdir(parents=True, exist_ok=True)
    record_peak_memory_at_exit(Path(peak_file))
    sys.argv = [str(REPO / "train.py"), *overrides]
    runpy.run_path(str(REPO / "train.py"), run_name="__main__")


if __name__ == "__main__":
    command = sys.argv[1:2]
    if command == ["throughput"]:
        sys.exit(throughput(*sys.argv[2:5]))
    if command == ["train"]:
        train(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(check(sys.argv[1:]))
