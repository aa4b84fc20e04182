"""Which rows the GPU check runs on this machine, what each is estimated to cost, and how each is measured. On a
CUDA machine: the CUDA tests, tiny ``experiment=dit`` runs in bf16 and fp16 (trained, resumed in a new process,
sampled), the throughput of DiT-XL/2 and PixArt-XL/2 (one subprocess per model, step, variant and batch size: each
peak memory its own, each compile static at one shape, a refused or out-of-memory batch leaving the others' rows)
and FSDP2 on one and on all GPUs. On a CPU the same rows at tiny sizes (a throughput row sweeps its batch sizes in
one subprocess there, to keep the check within a CI budget), with the CUDA-only rows recorded as skipped and why.
Every row has an id (``trainer-dit_xl_2-compile-b128``) by which a second call skips it or ``--rows`` picks it."""

from __future__ import annotations

import json
import math
import socket
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dit_trainer.apps.gpu_check.assets import SHIPPED_VAE, Assets
from dit_trainer.apps.gpu_check.device import compiler_missing
from dit_trainer.apps.gpu_check.online import ONLINE_METHODS
from dit_trainer.apps.gpu_check.rows import Command, Row, run_command, with_mfu
from dit_trainer.apps.gpu_check.throughput import BARE_VARIANTS, Job, job_micro_batches
from dit_trainer.components.fp8 import FP8_CAPABILITY

CUDA_TESTS = ["-m", "cuda"]  # pytest's selection: the tests marked for CUDA (each skips itself without a GPU)
# The training rows' tiny experiment=dit: 2 PixArt blocks on the shipped 32 px VAE's 4 x 16 x 16 latents and a random
# 2-layer T5, from a folder of shapes images; every recipe setting but the sizes is experiment=dit's.
TINY_TRAINING = ["+experiment=dit", "data.resolution=32", "data.num_workers=0", f"vae.pretrained={SHIPPED_VAE}",
                 "conditioner.max_length=8", "model.num_layers=2", "model.num_attention_heads=2",
                 "model.attention_head_dim=16", "logger=none", "trainer.batch_size=8", "trainer.log_every=1",
                 "optim.warmup_steps=5"]  # fmt: skip
# Batch sizes per process on a GPU, per variant: the levers of speed at 128, where eager is fastest (measured on one
# H100: 64 ran at 0.86 and 0.91 of 128's speed), and 256 images per update (which do not fit without a lever) by
# checkpointing or 2 x 128; every 2nd block checkpointed fits 192 (the estimate: DiT-XL/2 57, PixArt-XL/2 64 GiB).
GPU_BATCHES = {"eager": (128,), "compile": (128,), "checkpointing": (256,), "selective": (192,),
               "accumulation": (128,), "fp8": (128,), "fused_qkv": (128,)}  # fmt: skip
CPU_BATCHES = (4, 8)
# An online fine-tuning epoch (GRPO, DiffusionNFT) of a text-to-image model (--online: ~4.4 minutes more than the
# default plan's ~37 on one H100): one caption's group of 32 images.
ONLINE_MODELS, ONLINE_GROUP = ("pixart_xl_2",), 32


@dataclass(frozen=True)
class Options:
    repo: Path  # the repository: train.py, configs/, tests/ and scripts/gpu_check.py
    out: Path
    tiny: bool  # tiny models instead of the XL ones (always on a CPU)
    models: tuple[str, ...]
    batches: tuple[int, ...] | None  # None: GPU_BATCHES per variant (CPU_BATCHES on a CPU)
    variants: tuple[str, ...]
    warmup: int
    steps: int
    train_steps: int
    fsdp: bool  # FSDP rows on a CPU too
    fsdp_config: Path | None  # None: accelerate_configs/fsdp.yaml on GPUs, fsdp_cpu.yaml on a CPU
    row_timeout: float
    budget: float | None = None  # seconds this call may take (None: no limit)
    rows: tuple[str, ...] = ()  # patterns of the row ids to run (none: every row)
    skip: tuple[str, ...] = ()  # patterns of row ids not to run
    redo: tuple[str, ...] = ()  # patterns of measured row ids to measure again
    plan_for: str | None = None  # the GPU to plan for (--plan on another machine): its name, as the driver says
    online: bool = False  # an online fine-tuning epoch per method (GRPO, DiffusionNFT): not in the default plan


@dataclass(frozen=True)
class PlannedRow:
    """A row of the plan: ``measure`` runs it within a time-out (seconds) and returns what it measured."""

    id: str
    kind: str  # cuda_tests | train | throughput | fsdp
    seconds: float  # the estimate on this kind of machine (H100 measurements on a GPU)
    measure: Callable[[float], list[Row]]
    skipped: str = ""  # why this machine cannot run it (its row is recorded as skipped, at no cost)


# Estimated seconds, from one H100 (2026-11-26: a DiT-XL/2 trainer row at batch 128 took 59 s, its bare row 39 s,
# PixArt-XL/2's trainer at 64 90 s) and this project's 2-core CI machine: a row's start-up, model build, cache and
# first step, plus its timed steps at the images per second measured.
GPU_START_SECONDS = {("dit_xl_2", "bare"): 31, ("dit_xl_2", "trainer"): 50,
                     ("pixart_xl_2", "bare"): 40, ("pixart_xl_2", "trainer"): 85,
                     ("pixart_xl_2", "grpo"): 120, ("pixart_xl_2", "nft"): 120}  # fmt: skip
GPU_IMAGES_PER_SECOND = {"dit_xl_2": 350.0, "pixart_xl_2": 220.0}
# Not yet measured: an online epoch's image as ~15 training images' work (10 sampling steps with CFG, a few trained).
ONLINE_IMAGES_PER_SECOND = 15.0
# the compile, the recomputation's time
VARIANT_SECONDS = {"eager": 0, "compile": 30, "checkpointing": 10, "selective": 5, "accumulation": 0, "fp8": 40,
                   "fused_qkv": 0}  # fmt: skip
FIXED_SECONDS = {  # (on a GPU, on a CPU)
    "cuda_tests": (210, 0), "train": (60, 20), "fsdp": (40, 30), "throughput_tiny": (25, 8), "tiny_batch": (3, 3)
}  # fmt: skip


def estimate(job: Job, cuda: bool) -> float:
    """Seconds a throughput row of ``job`` is expected to take."""
    if job.tiny:
        return FIXED_SECONDS["throughput_tiny"][not cuda] + FIXED_SECONDS["tiny_batch"][not cuda] * len(job.batches)
    start = GPU_START_SECONDS[job.model, job.what] + VARIANT_SECONDS[job.variant]
    images = sum((job.warmup + job.steps) * batch * job_micro_batches(job) for batch in job.batches)
    rate = ONLINE_IMAGES_PER_SECOND if job.what in ONLINE_METHODS else GPU_IMAGES_PER_SECOND[job.model]
    return start + images / rate


def _python(options: Options, *args: str) -> list[str]:
    return [sys.executable, str(options.repo / "scripts" / "gpu_check.py"), *args]


def cuda_tests(options: Options, timeout: float) -> list[Row]:
    """Every test marked ``cuda`` (the GPU paths of training, precision, compile, FSDP, GRPO, DP and resume)."""
    # -rfEs: the summary at the end of the output (the report keeps its tail) names every failed test and skip
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", "-rfEs", *CUDA_TESTS, "tests"]
    outcome = run_command(Command(argv, options.repo, {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}, timeout))
    summary = (outcome.output.strip().splitlines() or [""])[-1]
    status = "ok" if outcome.returncode == 0 else "failed"
    return [Row("cuda tests", "cuda_tests", status, outcome.seconds, detail=summary, error=outcome.failure)]


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _check_training(run_dir: Path, half: int, steps: int) -> tuple[list[dict], str]:
    """The run's metrics and what is wrong with the run (''): steps 1..steps logged once each across the resume,
    finite losses, both checkpoints and the last step's sample grid written."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    logged = [record["step"] for record in records if "loss" in record]
    problems = [] if logged == list(range(1, steps + 1)) else [f"logged steps {logged[:3]}...{logged[-3:]}"]
    problems += [] if all(math.isfinite(r["loss"]) for r in records if "loss" in r) else ["a non-finite loss"]
    for folder in (
        f"checkpoints/checkpoint-{half}",
        f"checkpoints/checkpoint-{steps}",
        f"samples/step_{steps:07d}.png",
    ):
        problems += [] if (run_dir / folder).exists() else [f"no {folder}"]
    return records, "; ".join(problems)


def training(options: Options, assets: Assets, precision: str, cuda: bool, timeout: float) -> list[Row]:
    """``train_steps`` of the tiny recipe in ``precision``: the first half, then ``trainer.resume=latest`` to the
    end in a new process, with a checkpoint at each and the sample grid at the end."""
    name = f"train {precision}, checkpoint, resume, sample grid"
    half, steps = options.train_steps // 2, options.train_steps
    run_dir = fresh_folder(options.out / "runs", f"train-{precision}")
    overrides = [*TINY_TRAINING, f"data.path={assets.images}", f"conditioner.pretrained={assets.t5}",
                 f"trainer.mixed_precision={precision if cuda else 'no'}", f"hydra.run.dir={run_dir}",
                 f"trainer.checkpoint_every={half}", "trainer.sample_every=0"]  # fmt: skip
    seconds, peaks = 0.0, []
    for part, extra in (
        ("first half", [f"trainer.max_steps={half}"]),
        ("resume", [f"trainer.max_steps={steps}", "trainer.resume=latest"]),
    ):
        peak_file = run_dir.with_name(f"{run_dir.name}-{part.replace(' ', '-')}-peak.json")
        argv = _python(options, "train", str(peak_file), *overrides, *extra)
        outcome = run_command(Command(argv, options.repo, {"HF_HUB_OFFLINE": "1"}, timeout - seconds))
        seconds += outcome.seconds
        if outcome.failure:
            return [Row(name, "train", "failed", seconds, error=f"{part}: {outcome.failure}")]
        peaks.append(_read_json(peak_file))
    records, problem = _check_training(run_dir, half, steps)
    speeds = sorted(r["images_per_sec"] for r in records[half:] if "images_per_sec" in r)
    losses = [r["loss"] for r in records if "loss" in r]
    return [
        Row(
            name, "train", "failed" if problem else "ok", seconds, batch=8,
            img_s=speeds[len(speeds) // 2] if speeds else None,
            peak_memory_mb=max((p["peak_memory_mb"] for p in peaks if p.get("peak_memory_mb")), default=None),
            peak_rss_mb=max((p.get("peak_rss_mb") or 0 for p in peaks), default=None),
            detail=f"{steps} steps ({half} + {steps - half} resumed), loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
            f"mixed_precision={precision if cuda else 'no'}, run {run_dir}",
            error=problem,
        )
    ]  # fmt: skip


def _rows_of(result: dict, job: Job, seconds: float, peak: float | None) -> list[Row]:
    name = f"{job.what} {job.model} {job.variant}"
    if result.get("status") != "ok":
        return [Row(name, "throughput", result.get("status", "failed"), seconds, error=result.get("error", ""))]
    rows = []
    for measured in result["batches"]:
        row = Row(
            name, "throughput", measured["status"], seconds, batch=measured["batch"], processes=result["processes"],
            img_s=measured.get("img_s"),
            seconds_per_step=measured.get("seconds_per_step"), peak_memory_mb=measured.get("peak_memory_mb"),
            peak_rss_mb=result["peak_rss_mb"], train_flops_per_image=result["train_flops_per_image"],
            sdpa_kernels=result["sdpa_kernels"], error=measured.get("error", ""),
            detail=f"{result['mixed_precision']}, first step {measured['first_step_seconds']:.1f} s"
            if "first_step_seconds" in measured else "",
        )  # fmt: skip
        rows.append(with_mfu(row, peak))
    return rows


def measure_job(options: Options, row_id: str, job: Job, peak: float | None, timeout: float,
                launch: list[str] | None = None) -> list[Row]:  # fmt: skip
    """``job`` in a subprocess of its own (under ``launch``, e.g. ``accelerate launch ...``, when given)."""
    result_file = options.out / "results" / f"{row_id}.json"
    script = _python(options, "throughput", str(result_file), str(options.out / "work"), json.dumps([asdict(job)]))
    argv = [*launch, *script[1:]] if launch else script
    result_file.unlink(missing_ok=True)  # an earlier call's: never read as this one's
    env = {"HF_HUB_OFFLINE": "1"} | ({"OMP_NUM_THREADS": "1"} if launch and not torch.cuda.is_available() else {})
    outcome = run_command(Command(argv, options.repo, env, timeout))
    results = _read_json(result_file).get("jobs")
    if outcome.failure or results is None:
        failure = outcome.failure or "the subprocess wrote no result"
        return [Row(f"{job.what} {job.model} {job.variant}", "throughput", "failed", outcome.seconds, error=failure)]
    return _rows_of(results[0], job, outcome.seconds, peak)


def cache_items(batches: tuple[int, ...]) -> int:
    """Items of the synthetic cache: two batches of the largest size per process, on every process of a launch."""
    return 2 * max(batches) * max(2, torch.cuda.device_count())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fsdp(options: Options, job: Job, count: int, cuda: bool, peak: float | None, timeout: float) -> list[Row]:
    """The trainer's step of ``job`` under FSDP2 on ``count`` processes (GPUs; CPU processes with ``--fsdp``)."""
    config = options.fsdp_config or options.repo / "accelerate_configs" / ("fsdp.yaml" if cuda else "fsdp_cpu.yaml")
    name = f"fsdp2 {count} process{'es' if count > 1 else ''}"
    if not config.is_file():
        return [Row(name, "fsdp", "failed", error=f"no accelerate config {config}")]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
              "--num_processes", str(count), "--main_process_port", str(_free_port())]  # fmt: skip
    measured = measure_job(options, f"fsdp2-{count}p", job, peak, timeout, launch)
    return [replace(row, name=f"{name}: {row.name}", kind="fsdp") for row in measured]


def _skipped(row_id: str, name: str, kind: str, why: str) -> PlannedRow:
    return PlannedRow(row_id, kind, 0.0, lambda timeout: [Row(name, kind, "skipped", error=why)], skipped=why)


def _throughput_jobs(options: Options, cuda: bool) -> list[Job]:
    """One job per model, step, variant and batch size on a GPU; on a CPU one per model, step and variant (its
    batches in one process), but a compiled one per batch size: each compile static at one shape."""
    jobs = []
    for model in options.models:
        for variant in options.variants:
            batches = options.batches or (GPU_BATCHES[variant] if cuda else CPU_BATCHES)
            sweeps = [(b,) for b in batches] if cuda or variant in ("compile", "fp8") else [tuple(batches)]
            jobs += [Job(model, "trainer", variant, sweep, options.tiny, options.warmup, options.steps,
                         cache_items(sweep)) for sweep in sweeps]  # fmt: skip
            if variant in BARE_VARIANTS:  # the step's ceiling, at the largest batch on a GPU
                bare = sweeps[-1:] if cuda else sweeps
                jobs += [Job(model, "bare", variant, sweep, options.tiny, options.warmup, options.steps,
                             cache_items(sweep)) for sweep in bare]  # fmt: skip
        if options.online and model in ONLINE_MODELS and "eager" in options.variants:  # an epoch a step: fewer
            group = (ONLINE_GROUP if cuda else CPU_BATCHES[0],)
            jobs += [Job(model, what, "eager", group, options.tiny, min(options.warmup, 2), min(options.steps, 5))
                     for what in ONLINE_METHODS]  # fmt: skip
    return jobs


def _cannot_run(variant: str, compiler: str, machine: dict) -> str:
    """Why ``machine`` cannot run a row of ``variant`` ('' when it can)."""
    if variant in ("compile", "fp8") and compiler:
        return compiler
    capability = machine.get("compute_capability") or ""  # "9.0"; "[N/A]" or "" where the driver does not say
    known = capability.replace(".", "").isdigit()
    if variant == "fp8" and known and tuple(map(int, capability.split("."))) < FP8_CAPABILITY:
        return f"FP8 matmuls need compute capability 8.9 or newer; this GPU's is {capability}"
    if variant == "fp8" and not machine["gpus"]:
        return "FP8 matmuls need a GPU (precision.fp8_emulate=true checks the numerics on a CPU, slowly)"
    return ""


def plan_rows(options: Options, machine: dict, assets: Callable[[], Assets]) -> list[PlannedRow]:
    """Every row ``machine`` (this one, or ``options.plan_for``'s) would run, in order; ``assets`` writes the tiny
    models on first use."""
    cuda, peak = machine["gpus"] > 0, machine["peak_bf16_flops"]
    fixed = {kind: seconds[not cuda] for kind, seconds in FIXED_SECONDS.items()}
    no_gpu = "no CUDA device: a CUDA path"
    rows = [
        PlannedRow("cuda-tests", "cuda_tests", fixed["cuda_tests"], lambda timeout: cuda_tests(options, timeout))
        if cuda else _skipped("cuda-tests", "cuda tests", "cuda_tests", f"{no_gpu}; the CUDA tests run on a GPU")
    ]  # fmt: skip
    for precision in ("bf16", "fp16"):
        row_id, name = f"train-{precision}", f"train {precision}, checkpoint, resume, sample grid"
        if precision == "fp16" and not cuda:
            rows.append(_skipped(row_id, name, "train", f"{no_gpu}: fp16 autocast with its grad scaler"))
            continue
        measure = lambda timeout, p=precision: training(options, assets(), p, cuda, timeout)  # noqa: E731
        rows.append(PlannedRow(row_id, "train", fixed["train"], measure))
    compiler = "" if options.plan_for else compiler_missing()
    for job in _throughput_jobs(options, cuda):
        row_id = f"{job.what}-{job.model}-{job.variant}-b{'+'.join(map(str, job.batches))}"
        why = _cannot_run(job.variant, compiler, machine)
        if why:
            rows.append(_skipped(row_id, f"{job.what} {job.model} {job.variant}", "throughput", why))
            continue
        measure = lambda timeout, job=job, row_id=row_id: measure_job(options, row_id, job, peak, timeout)  # noqa: E731
        rows.append(PlannedRow(row_id, "throughput", estimate(job, cuda), measure))
    if not (cuda or options.fsdp):
        return rows + [_skipped("fsdp2", "fsdp", "fsdp", "FSDP on CPU processes runs only with --fsdp")]
    batches = options.batches or (GPU_BATCHES["eager"] if cuda else CPU_BATCHES)
    batch = sorted(batches)[len(batches) // 2]
    job = Job(options.models[0], "trainer", "eager", (batch,), options.tiny, options.warmup, options.steps,
              cache_items((batch,)))  # fmt: skip
    for count in sorted({1, max(1, torch.cuda.device_count())}) if cuda else [2]:
        measure = lambda timeout, count=count: fsdp(options, job, count, cuda, peak, timeout)  # noqa: E731
        rows.append(PlannedRow(f"fsdp2-{count}p", "fsdp", fixed["fsdp"] + estimate(job, cuda), measure))
    return rows


def fresh_folder(parent: Path, name: str) -> Path:
    """A new folder ``parent/name``, or ``name-2``, ``name-3``, ... when that exists (created here, so that two
    rows or checks never share one)."""
    parent.mkdir(parents=True, exist_ok=True)
    folder, number = parent / name, 1
    while True:
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            number += 1
            folder = parent / f"{name}-{number}"
