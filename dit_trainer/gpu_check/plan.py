"""Which rows the GPU check runs on this machine, and how each is judged. On a CUDA machine: the CUDA tests, the
50-step tiny ``experiment=dit`` runs in bf16 and fp16, the throughput sweeps of DiT-XL/2 and PixArt-XL/2 (one
subprocess per model, step kind and variant) and FSDP2 on one and on all GPUs. On a CPU the same rows at tiny sizes
(the throughput jobs share one subprocess there, to keep the check within a CI budget), with the CUDA-only rows
recorded as skipped and why."""

from __future__ import annotations

import json
import math
import socket
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dit_trainer.errors import ConfigError, shortlist
from dit_trainer.gpu_check.assets import SHIPPED_VAE, Assets, write_assets
from dit_trainer.gpu_check.rows import (
    JSON_NAME,
    MARKDOWN_NAME,
    Command,
    Row,
    guarded,
    machine,
    run_command,
    with_mfu,
    write_report,
)
from dit_trainer.gpu_check.throughput import Job

CUDA_TEST_SELECTION = "cuda"  # pytest -k: the tests named for CUDA (each skips itself without a GPU)
# The training rows' tiny experiment=dit: 2 PixArt blocks on the shipped 32 px VAE's 4 x 16 x 16 latents and a random
# 2-layer T5, from a folder of shapes images; every recipe setting but the sizes is experiment=dit's.
TINY_TRAINING = ["+experiment=dit", "data.resolution=32", "data.num_workers=0", f"vae.pretrained={SHIPPED_VAE}",
                 "text_encoder.max_length=8", "model.num_layers=2", "model.num_attention_heads=2",
                 "model.attention_head_dim=16", "logger=none", "trainer.batch_size=8", "trainer.log_every=1",
                 "optim.warmup_steps=5"]  # fmt: skip
# What the check writes into --out: the report, and the folders of its rows' assets, runs, results and work.
OWN_NAMES = (JSON_NAME, MARKDOWN_NAME, "assets", "runs", "results", "work")


@dataclass(frozen=True)
class Options:
    repo: Path  # the repository: train.py, configs/, tests/ and scripts/gpu_check.py
    out: Path
    tiny: bool  # tiny models instead of the XL ones (always on a CPU)
    models: tuple[str, ...]
    batches: tuple[int, ...]
    variants: tuple[str, ...]
    warmup: int
    steps: int
    train_steps: int
    fsdp: bool  # FSDP rows on a CPU too
    fsdp_config: Path | None  # None: accelerate_configs/fsdp.yaml on GPUs, fsdp_cpu.yaml on a CPU
    row_timeout: float


def _python(options: Options, *args: str) -> list[str]:
    return [sys.executable, str(options.repo / "scripts" / "gpu_check.py"), *args]


def cuda_tests(options: Options, cuda: bool) -> list[Row]:
    if not cuda:
        return [Row("cuda tests", "cuda_tests", "skipped", error="no CUDA device: the CUDA tests run only on a GPU")]
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-k", CUDA_TEST_SELECTION, "tests"]
    outcome = run_command(Command(argv, options.repo, {"HF_HUB_OFFLINE": "1"}, options.row_timeout))
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


def training(options: Options, assets: Assets, precision: str, cuda: bool) -> list[Row]:
    """``train_steps`` of the tiny recipe in ``precision``: the first half, then ``trainer.resume=latest`` to the
    end in a new process, with a checkpoint at each and the sample grid at the end."""
    name = f"train {precision}, checkpoint, resume, sample grid"
    if precision == "fp16" and not cuda:
        return [Row(name, "train", "skipped", error="fp16 autocast with its grad scaler is a CUDA path")]
    half, steps = options.train_steps // 2, options.train_steps
    run_dir = fresh_folder(options.out / "runs", f"train-{precision}")
    overrides = [*TINY_TRAINING, f"data.path={assets.images}", f"text_encoder.pretrained={assets.t5}",
                 f"trainer.mixed_precision={precision if cuda else 'no'}", f"hydra.run.dir={run_dir}",
                 f"trainer.checkpoint_every={half}", "trainer.sample_every=0"]  # fmt: skip
    seconds, peaks = 0.0, []
    for part, extra in (
        ("first half", [f"trainer.max_steps={half}"]),
        ("resume", [f"trainer.max_steps={steps}", "trainer.resume=latest"]),
    ):
        peak_file = run_dir.with_name(f"{run_dir.name}-{part.replace(' ', '-')}-peak.json")
        argv = _python(options, "train", str(peak_file), *overrides, *extra)
        outcome = run_command(Command(argv, options.repo, {"HF_HUB_OFFLINE": "1"}, options.row_timeout))
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


def measure_jobs(options: Options, jobs: list[Job], peak: float | None, launch: list[str] | None = None) -> list[Row]:
    """``jobs`` in one subprocess (under ``launch``, e.g. ``accelerate launch ...``, when given)."""
    tag = f"{jobs[0].what}-{jobs[0].model}-{jobs[0].variant}-{len(jobs)}-{launch[-1] if launch else 1}"
    result_file = options.out / "results" / f"{tag}.json"
    script = _python(
        options, "throughput", str(result_file), str(options.out / "work"), json.dumps([asdict(j) for j in jobs])
    )
    argv = [*launch, *script[1:]] if launch else script
    result_file.unlink(missing_ok=True)  # an earlier check's: never read as this one's
    env = {"HF_HUB_OFFLINE": "1"} | ({"OMP_NUM_THREADS": "1"} if launch and not torch.cuda.is_available() else {})
    outcome = run_command(Command(argv, options.repo, env, options.row_timeout))
    results = _read_json(result_file).get("jobs")
    if outcome.failure or results is None:
        failure = outcome.failure or "the subprocess wrote no result"
        return [
            Row(f"{j.what} {j.model} {j.variant}", "throughput", "failed", outcome.seconds, error=failure) for j in jobs
        ]
    return [row for job, result in zip(jobs, results) for row in _rows_of(result, job, outcome.seconds, peak)]


def throughput(options: Options, cuda: bool, peak: float | None) -> list[Row]:
    """The bare step and the trainer, per model and variant, over the batch sweep; on a CPU in one subprocess."""
    jobs = [
        Job(model, what, variant, options.batches, options.tiny, options.warmup, options.steps, cache_items(options))
        for model in options.models
        for what in ("bare", "trainer")
        for variant in options.variants
    ]
    skipped = []
    if not cuda and "compile" not in options.variants:
        reason = (
            "the first compile takes ~50 s on 2 CPU cores and gains nothing there; --variants eager,compile runs it"
        )
        skipped = [Row(f"{what} compile", "throughput", "skipped", error=reason) for what in ("bare", "trainer")]
    if cuda:  # one subprocess per job: each peak memory its own
        rows = [row for job in jobs for row in measure_jobs(options, [job], peak)]
    else:
        rows = measure_jobs(options, jobs, peak)
    return rows + skipped


def cache_items(options: Options) -> int:
    """Items of the synthetic cache: two batches of the largest size per process, on every process of a launch."""
    return 2 * max(options.batches) * max(2, torch.cuda.device_count())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fsdp(options: Options, cuda: bool, peak: float | None) -> list[Row]:
    """The trainer's step of the first model under FSDP2 at the sweep's middle batch, on one process and on every
    GPU (two processes on a CPU, with ``--fsdp``)."""
    if not (cuda or options.fsdp):
        return [Row("fsdp", "fsdp", "skipped", error="FSDP on CPU processes runs only with --fsdp")]
    config = options.fsdp_config or options.repo / "accelerate_configs" / ("fsdp.yaml" if cuda else "fsdp_cpu.yaml")
    processes = sorted({1, torch.cuda.device_count()}) if cuda else [2]
    batch = sorted(options.batches)[len(options.batches) // 2]
    job = Job(options.models[0], "trainer", "eager", (batch,), options.tiny, options.warmup, options.steps,
              cache_items(options))  # fmt: skip
    rows = []
    for count in processes:
        name = f"fsdp2 {count} process{'es' if count > 1 else ''}"
        if not config.is_file():
            rows.append(Row(name, "fsdp", "failed", error=f"no accelerate config {config}"))
            continue
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
                  "--num_processes", str(count), "--main_process_port", str(_free_port())]  # fmt: skip
        measured = guarded(name, "fsdp", lambda launch=launch: measure_jobs(options, [job], peak, launch))
        rows += [replace(row, name=f"{name}: {row.name}", kind="fsdp") for row in measured]
    return rows


def _is_report(path: Path) -> bool:
    """Whether ``path`` is a report this check wrote (``write_report``'s JSON)."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(report, dict) and {"machine", "options", "rows"} <= report.keys()


def require_own_folder(out: Path) -> None:
    """``--out`` is new, empty, or a folder an earlier check wrote (its report, and nothing but the check's own
    names): the check rewrites its report and assets there, so a user's files (their own ``gpu_check.json``, notes,
    another tool's output) are refused, never overwritten. A training row's run folder is new in every check
    (``fresh_folder``), so a second check into the same folder trains afresh instead of finding the first one's
    checkpoints."""
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", str(out), "it is a file, not a folder", "pass a new folder")
    entries = sorted(out.iterdir()) if out.is_dir() else []
    names = [entry.name + ("/" if entry.is_dir() else "") for entry in entries]
    foreign = [name for entry, name in zip(entries, names) if entry.name not in OWN_NAMES]
    if foreign or (entries and not _is_report(out / JSON_NAME)):
        foreign = foreign or names  # no report: none of it is an earlier check's
        raise ConfigError(
            "--out",
            str(out),
            f"it holds {shortlist(foreign, 4)}, which no GPU check wrote (an earlier check's folder holds its "
            f"{JSON_NAME} report), and the check writes {', '.join(OWN_NAMES)} there",
            "pass a new folder, e.g. `--out outputs/gpu_check/h100-2` (the default is a new dated one), or move "
            "those files away",
        )


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


def run_check(options: Options) -> tuple[Path, Path]:
    """Every row, in order, the report rewritten after each (first with no rows, so that a check cut short leaves
    a folder the next one recognises as its own); returns the JSON and Markdown paths."""
    require_own_folder(options.out)
    options.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    header = {"machine": machine(), "options": {k: str(v) for k, v in asdict(options).items()}}
    peak = header["machine"]["peak_bf16_flops"]
    rows: list[Row] = []
    write_report(options.out, rows, header)
    assets = write_assets(options.out / "assets")
    steps = [
        lambda: cuda_tests(options, cuda),
        lambda: training(options, assets, "bf16", cuda),
        lambda: training(options, assets, "fp16", cuda),
        lambda: throughput(options, cuda, peak),
        lambda: fsdp(options, cuda, peak),
    ]
    for step in steps:
        rows += guarded("row", "check", step)
        paths = write_report(options.out, rows, header)
        print(f"{len(rows)} rows; report: {paths[0]}", flush=True)
    return paths
