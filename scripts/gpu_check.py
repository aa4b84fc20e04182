"""The GPU check: correctness, throughput (img/s, peak memory, MFU) and FSDP2 of this machine, in calls that each
fit a time budget; a second call into the same --out runs only the rows the first did not finish.

    scripts/gpu_check.sh --out outputs/gpu_check/h100 --budget 540     # again, until it says every row is measured
    scripts/gpu_check.sh --plan --plan-for "NVIDIA H100 80GB HBM3"      # the rows, estimates and calls; runs nothing

Options: python scripts/gpu_check.py --help. Writes OUT/gpu_check.json and OUT/gpu_check.md (README: "The GPU
check"). The subcommands `throughput` and `train` are the rows' subprocesses.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import runpy
import sys
import time
from datetime import datetime
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(size) for size in text.split(","))


def _names(text: str) -> tuple[str, ...]:
    return tuple(name for name in text.split(",") if name)


def _parser() -> argparse.ArgumentParser:
    from dit_trainer.apps.gpu_check.throughput import RECIPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_out = REPO / "outputs" / "gpu_check" / f"{datetime.now():%Y-%m-%d/%H-%M-%S}"
    parser.add_argument("--out", type=Path, default=default_out, help="the report's folder (default: %(default)s)")
    parser.add_argument("--budget", type=float, help="seconds this call may take: a row that no longer fits ends it")
    parser.add_argument("--rows", type=_names, default=(), help="row ids or patterns, comma-separated ('trainer-*')")
    parser.add_argument("--skip", type=_names, default=(), help="rows not to run (ids or patterns)")
    parser.add_argument("--redo", type=_names, default=(), help="measured rows to measure again (ids or patterns)")
    parser.add_argument("--plan", action="store_true", help="print the rows, their estimates and the calls; run none")
    parser.add_argument("--plan-for", metavar="GPU", help="plan for that GPU's name from another machine")
    parser.add_argument("--models", type=_names, default=tuple(RECIPES), help="default: " + ",".join(RECIPES))
    default_batches = "per process; default on a GPU: 256 checkpointed, 192 selective, else 128; 4,8 on a CPU"
    parser.add_argument("--batches", type=_sizes, help=default_batches)
    parser.add_argument("--variants", type=_names, default=None, help="default on a GPU: every lever; eager on a CPU")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row (%(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up steps per row (%(default)s)")
    parser.add_argument("--train-steps", type=int, help="the tiny training rows' steps (50; 10 on a CPU)")
    parser.add_argument("--tiny", action="store_true", help="tiny models on a GPU too")
    parser.add_argument("--fsdp", action="store_true", help="the FSDP rows on a CPU too (2 processes)")
    parser.add_argument("--fsdp-config", type=Path, help="the accelerate config of the FSDP rows")
    parser.add_argument("--online", action="store_true", help="an epoch of GRPO and of DiffusionNFT at real size too")
    parser.add_argument("--row-timeout", type=float, default=540, help="seconds one row may take (%(default)s)")
    return parser


def check(argv: list[str]) -> int:
    from dit_trainer.apps.gpu_check.assets import write_assets
    from dit_trainer.apps.gpu_check.device import UnusableGPUError, machine, nvidia_driver, require_usable_gpu
    from dit_trainer.apps.gpu_check.peak import peak_flops
    from dit_trainer.apps.gpu_check.plan import Options, plan_rows
    from dit_trainer.apps.gpu_check.runner import describe, header_of, run_plan, select
    from dit_trainer.apps.gpu_check.throughput import RECIPES, VARIANTS
    from dit_trainer.errors import ConfigError, exit_code

    # the call began when scripts/gpu_check.sh did (its install counts against --budget), else now
    started = time.monotonic() - max(0.0, time.time() - float(os.environ.get("GPU_CHECK_STARTED", time.time())))
    driver = nvidia_driver()
    try:
        require_usable_gpu(driver)
    except UnusableGPUError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    parser = _parser()
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() or args.plan_for is not None
    variants = args.variants or (VARIANTS if cuda else ("eager",))
    train_steps = args.train_steps or (50 if cuda else 10)
    unknown = [name for name in args.models if name not in RECIPES] + [v for v in variants if v not in VARIANTS]
    if unknown or train_steps < 2:
        parser.error(f"unknown models or variants {unknown} (models: {list(RECIPES)}, variants: {list(VARIANTS)})"
                     if unknown else "--train-steps must be at least 2 (half of them are resumed)")  # fmt: skip
    options = Options(
        REPO, args.out.resolve(), args.tiny or not cuda, args.models, args.batches, variants, args.warmup,
        args.steps, train_steps, args.fsdp, args.fsdp_config, args.row_timeout, args.budget, args.rows,
        args.skip, args.redo, args.plan_for, args.online,
    )  # fmt: skip
    here = machine(driver)
    if args.plan_for:
        planned_for = {"device": args.plan_for, "gpus": 1, "peak_bf16_flops": peak_flops(args.plan_for)}
        here = {**here, **planned_for, "compute_capability": None}

    @functools.cache
    def tiny_assets():  # written when a training row first needs them (never by --plan)
        return write_assets(options.out / "assets")

    try:
        planned = select(plan_rows(options, here, tiny_assets), args.rows, args.skip)
        if args.plan:
            print(f"The GPU check's plan for {here['device']}:\n{describe(planned, set(), args.budget)}")
            return 0
        json_path, markdown_path = run_plan(options, planned, header_of(options, here), started)
    except ConfigError as error:  # a bad --rows, or an --out holding files the check did not write: nothing written
        print(f"error: {error}", file=sys.stderr)
        return exit_code(error)
    print(markdown_path.read_text(encoding="utf-8"))
    print(f"Wrote {json_path} and {markdown_path}")
    return 0


def throughput(result: str, work: str, jobs: str) -> int:
    """A throughput row's subprocess: the jobs' results into ``result`` (on rank 0 of a launch)."""
    from dit_trainer.apps.gpu_check.assets import write_assets
    from dit_trainer.apps.gpu_check.throughput import Job, rank, run_jobs

    work_dir = Path(work)
    results = run_jobs([Job(**{**job, "batches": tuple(job["batches"])}) for job in json.loads(jobs)],
                       REPO / "configs", write_assets(work_dir / "assets"), work_dir)  # fmt: skip
    if rank() == 0:
        Path(result).parent.mkdir(parents=True, exist_ok=True)
        Path(result).write_text(json.dumps({"jobs": results}, indent=1), encoding="utf-8")
    return 0


def train(peak_file: str, overrides: list[str]) -> None:
    """A training row's subprocess: train.py with ``overrides``, its peak memory written to ``peak_file`` at exit."""
    from dit_trainer.apps.gpu_check.rows import record_peak_memory_at_exit

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
