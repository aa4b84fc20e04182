"""Running the GPU check's rows, each in a subprocess of its own, and writing what they measured: ``gpu_check.json``
(every row with its numbers, or its failure) and ``gpu_check.md`` (one table). A row that fails, times out or
crashes is recorded with the tail of its output; the rows after it still run."""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import resource
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import psutil
import torch

from dit_trainer.apps.gpu_check.peak import mfu
from dit_trainer.durable import write_text_atomically

JSON_NAME, MARKDOWN_NAME = "gpu_check.json", "gpu_check.md"
TIMED_OUT = "stopped after its time-out"  # the last line of a timed-out row's output
TAIL = 3000  # characters of a failed row's output kept in the report


@dataclass
class Row:
    """One line of the report. ``status``: ok | failed | skipped | oom | refused (the memory check's verdict) |
    stopped (the call's budget ended it: the next call runs it again)."""

    name: str
    kind: str  # cuda_tests | train | throughput | fsdp
    status: str
    seconds: float = 0.0  # wall time of the row's subprocesses
    batch: int | None = None  # per process
    processes: int = 1
    img_s: float | None = None  # of all processes together
    seconds_per_step: float | None = None
    peak_memory_mb: float | None = None  # CUDA: torch.cuda.max_memory_allocated; None on a CPU
    peak_rss_mb: float | None = None  # the subprocess's peak resident memory
    mfu: float | None = None  # None where the device's peak FLOP/s is unknown (a CPU)
    train_flops_per_image: float | None = None
    sdpa_kernels: list[str] = field(default_factory=list)
    detail: str = ""  # what the row checked or measured, in words
    error: str = ""  # why it failed or was skipped
    id: str = ""  # the planned row it belongs to (``plan.PlannedRow.id``): what a second call skips


@dataclass
class Command:
    """A subprocess of a row: ``argv`` run from ``cwd`` with ``env`` added, killed after ``timeout`` seconds."""

    argv: list[str]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 540


@dataclass
class Outcome:
    returncode: int
    output: str
    seconds: float

    @property
    def failure(self) -> str:
        """'' when it succeeded; else what happened and the tail of its output."""
        if self.returncode == 0:
            return ""
        cause = "timed out" if self.returncode is None else f"exit code {self.returncode}"
        return f"{cause}: {self.output[-TAIL:]}"


def run_command(command: Command) -> Outcome:
    """Run ``command`` in a session of its own, stdout and stderr together. A timeout is an outcome (return code
    None), not an exception; it, and anything that stops the check meanwhile (Ctrl-C, which reaches only the
    terminal's foreground group), ends every process the command started (``stop_tree``)."""
    start = time.perf_counter()
    process = subprocess.Popen(
        command.argv, cwd=command.cwd, env={**os.environ, **command.env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=command.timeout)
        return Outcome(process.returncode, output, time.perf_counter() - start)
    except subprocess.TimeoutExpired:
        stop_tree(process.pid)
        output, _ = process.communicate()
        stopped = f"{TIMED_OUT} of {command.timeout:g} s, with every process it started"
        return Outcome(None, f"{output}\n{stopped}", time.perf_counter() - start)  # the last line: the report's note
    except BaseException:
        stop_tree(process.pid)
        raise


def stop_tree(pid: int) -> None:
    """Kill ``pid``, every process below it and their process groups. A row's own session is not enough: the FSDP
    rows run ``accelerate launch``, whose ranks (torch elastic's workers) run in sessions of their own and would
    keep the GPUs and the port while the next rows measure. Never this process's own group."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]  # while the launcher lives: it is their parent
    except psutil.NoSuchProcess:
        processes = []
    groups = {pid}  # the row's session: its group id is its pid
    for process in processes:
        with contextlib.suppress(psutil.Error, OSError):
            groups.add(os.getpgid(process.pid))
        with contextlib.suppress(psutil.Error):
            process.kill()
    for group in groups - {os.getpgrp()}:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(process) for process in processes[1:]):
        time.sleep(0.05)  # (the root is the caller's child: Popen reaps it)


def _alive(process: psutil.Process) -> bool:
    """Whether ``process`` still runs (a killed one whose parent has not reaped it is a zombie: it does not)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def guarded(name: str, kind: str, measure: Callable[[], list[Row]]) -> list[Row]:
    """``measure``'s rows, or one failed row holding the exception: a bug in one row's bookkeeping must not end the
    check either."""
    try:
        return measure()
    except Exception as error:  # noqa: BLE001 (recorded, and the next row runs)
        return [Row(name, kind, "failed", error=f"{type(error).__name__}: {error}"[-TAIL:])]


def record_peak_memory_at_exit(path: Path) -> None:
    """Have this process write its peak memory to ``path`` as it exits (however it exits): what a training row's
    ``train.py`` subprocess reports."""

    def write() -> None:
        cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_initialized() else None
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        path.write_text(json.dumps({"peak_memory_mb": cuda, "peak_rss_mb": rss}), encoding="utf-8")

    atexit.register(write)


def with_mfu(row: Row, peak: float | None) -> Row:
    """``row`` with its MFU per device (the processes' img/s over as many devices' peak)."""
    if row.img_s and row.train_flops_per_image:
        row.mfu = mfu(row.img_s / row.processes, row.train_flops_per_image, peak)
    return row


def _number(value: float | None, digits: int = 1) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def markdown(report: dict) -> str:
    """The report as one Markdown table (and a header line saying where it was measured)."""
    head = report["machine"]
    peak = head["peak_bf16_flops"]
    peak_said = f"peak bf16 {_number(peak / 1e12)} TFLOP/s" if peak else "no known bf16 peak (MFU not computed)"
    machine = f"{head['device']}, torch {head['torch']}, CUDA {head['cuda']}, {peak_said}"
    lines = [
        f"# GPU check: {machine} ({report['finished']})",
        "",
        "| row | status | batch | img/s | s/step | peak MiB | MFU | SDPA kernels | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        memory = row["peak_memory_mb"] if row["peak_memory_mb"] is not None else row["peak_rss_mb"]
        share = "n/a" if row["mfu"] is None and row["img_s"] else ("" if row["mfu"] is None else f"{row['mfu']:.1%}")
        error = row["error"].strip().splitlines()[-1] if row["error"].strip() else ""  # its last line: the cause
        notes = " / ".join(part for part in dict.fromkeys((row["detail"], error)) if part)  # once if they agree
        cells = [row["name"], row["status"], "" if row["batch"] is None else str(row["batch"]), _number(row["img_s"]),
                 _number(row["seconds_per_step"], 3), _number(memory, 0), share, " ".join(row["sdpa_kernels"]),
                 notes.replace("|", "/")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("peak MiB: CUDA peak allocated where a GPU ran the row, else the process's peak resident memory.")
    return "\n".join(lines) + "\n"


def write_report(out: Path, rows: list[Row], header: dict) -> tuple[Path, Path]:
    """``gpu_check.json`` and ``gpu_check.md`` in ``out``, each replaced whole (rewritten after every row, so that a
    check cut short, even while writing, leaves every row it measured)."""
    report = {**header, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": [asdict(row) for row in rows]}
    write_text_atomically(out / JSON_NAME, json.dumps(report, indent=1))
    write_text_atomically(out / MARKDOWN_NAME, markdown(report))
    return out / JSON_NAME, out / MARKDOWN_NAME


def read_rows(report: dict) -> list[Row]:
    """The rows of an earlier report (fields a newer check added get their defaults)."""
    names = {field.name for field in fields(Row)}
    return [Row(**{key: value for key, value in row.items() if key in names}) for row in report.get("rows", [])]
