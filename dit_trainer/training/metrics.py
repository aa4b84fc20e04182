"""``metrics.jsonl`` (always written) and the loss-curve PNG drawn from it at the end of a run."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch
from accelerate import Accelerator
from PIL import Image, ImageDraw

from dit_trainer.durable import write_text_atomically

logger = logging.getLogger(__name__)
# One line per logged step, for the run's text log: train.py sends it to train.log only (the console has the
# progress bar); elsewhere it reaches whatever handles the root logger.
METRIC_LINES = logging.getLogger("dit_trainer.metric_lines")
HEADLINE = ("val/loss", "reward/mean", "fid/fid", "privacy/epsilon")  # the monitors' numbers a metric line shows


def mean_over_processes(accelerator: Accelerator, values: torch.Tensor) -> float:
    """The mean of ``values`` (this process's per-step losses) over steps and then over processes: every rank
    trains on its own shard, so one rank's loss alone is a noisier, biased view of the run."""
    return accelerator.reduce(values.mean(), reduction="mean").item()


def metric_line(step: int, max_steps: int, metrics: dict[str, float]) -> str:
    """``step 100/200: loss 1.2739, lr 0.0001, grad_norm 0.532, 26 img/s, val/loss 0.8990``: the training metrics of
    a log step and the monitors' headline numbers (``metrics.jsonl`` has every metric)."""
    formats = {"loss": ".4f", "lr": ".3g", "grad_norm": ".3g"}
    parts = [f"{key} {metrics[key]:{spec}}" for key, spec in formats.items() if key in metrics]
    if "images_per_sec" in metrics:
        parts.append(f"{metrics['images_per_sec']:.0f} img/s")
    if metrics.get("skipped_steps"):
        parts.append(f"skipped_steps {metrics['skipped_steps']}")
    parts += [f"{key} {metrics[key]:.4f}" for key in HEADLINE if key in metrics]
    return f"step {step}/{max_steps}: {', '.join(parts)}"


def log_lines_to_files_only() -> None:
    """Send the metric lines only to the log files among the root logger's handlers (Hydra's train.log): called by
    train.py once Hydra has configured logging."""
    lines = logging.getLogger(METRIC_LINES.name)
    lines.handlers = [handler for handler in logging.getLogger().handlers if isinstance(handler, logging.FileHandler)]
    lines.propagate = False
    lines.setLevel(logging.INFO)


class MetricsFile:
    """Appends one JSON object per logged step; a resumed run continues the same file.

    A kill can tear the line being written: reading skips an unreadable line (with a warning) instead of failing
    every later resume, and the resume's rewrite goes through a temporary file, so a kill during it keeps the
    history.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, metrics: dict[str, float | int]) -> None:
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(metrics) + "\n")

    def amend(self, step: int, metrics: dict[str, float]) -> None:
        """Add ``metrics`` to the line of ``step`` (appended when that step logged nothing yet), rewritten as a
        resume's truncation is: the line a run never stopped would have written."""
        records = self.read()
        if not records or records[-1]["step"] != step:
            records.append({"step": step})
        records[-1] = records[-1] | metrics
        write_text_atomically(self.path, "".join(json.dumps(record) + "\n" for record in records))

    def truncate_after(self, step: int) -> list[dict]:
        """Drop the lines of steps after ``step`` (returned): what an interrupted attempt logged past the checkpoint a
        run resumes from, so that the file describes one run."""
        if not self.path.exists():
            return []
        records = self.read()
        kept = [record for record in records if record["step"] <= step]
        write_text_atomically(self.path, "".join(json.dumps(record) + "\n" for record in kept))
        return [record for record in records if record["step"] > step]

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        records = []
        for number, line in enumerate(self.path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            record = _parse(line)
            if record is not None:
                records.append(record)
            elif line.strip():
                logger.warning(f"{self.path}, line {number}: not a complete record (a write cut short?); skipped")
        return records


def _parse(line: str) -> dict | None:
    """One metrics record, or None for a torn or foreign line."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


class TimestepLossBuckets:
    """The per-sample training loss averaged in ten timestep buckets (``loss/t_0-99`` ... for T = 1000) over the
    steps since the last log: how well each noise level is learned, which the mean loss hides. The sums and counts
    are kept in ``since_log`` (the training state's, which a checkpoint keeps), under ``loss_by_timestep``."""

    BUCKETS = 10
    KEY = "loss_by_timestep"

    def __init__(self, num_timesteps: int, since_log: dict[str, torch.Tensor], device: torch.device) -> None:
        self.num_timesteps = num_timesteps
        self.since_log = since_log
        self.device = device
        width = num_timesteps / self.BUCKETS
        self.names = [f"loss/t_{round(k * width)}-{round((k + 1) * width) - 1}" for k in range(self.BUCKETS)]

    def add(self, losses: torch.Tensor, timesteps: torch.Tensor) -> None:
        """``losses`` (B,) at ``timesteps`` (B,): integers in [0, T) or flow matching's sigma * T in (0, T]."""
        index = (timesteps.float() * self.BUCKETS / self.num_timesteps).long().clamp(0, self.BUCKETS - 1)
        sums, counts = self._totals()
        sums.index_add_(0, index, losses.detach().float())
        counts.index_add_(0, index, torch.ones_like(sums[index]))

    def collect(self, accelerator: Accelerator) -> dict[str, float]:
        """Means over every process since the last call (every process calls it at the same step), then reset."""
        totals = accelerator.reduce(self._totals(), reduction="sum").tolist()
        self.since_log.pop(self.KEY)
        return {name: total / count for name, total, count in zip(self.names, *totals) if count}

    def _totals(self) -> torch.Tensor:
        """(2, BUCKETS): the sums and the counts since the last log (made at the first step after it)."""
        if self.KEY not in self.since_log:
            self.since_log[self.KEY] = torch.zeros(2, self.BUCKETS, device=self.device)
        return self.since_log[self.KEY]


def save_loss_curve(records: list[dict], path: Path, size: tuple[int, int] = (640, 360)) -> None:
    """A plain line plot of loss against step (log-scale y): enough to judge a run without other tools."""
    points = [(r["step"], r["loss"]) for r in records if "loss" in r and r["loss"] > 0 and math.isfinite(r["loss"])]
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = 60, 20, size[0] - 20, size[1] - 40
    draw.rectangle((left, top, right, bottom), outline="black")
    if len(points) >= 2:
        steps = [s for s, _ in points]
        logs = [math.log10(v) for _, v in points]
        lo, hi = min(logs), max(logs)
        hi = hi if hi > lo else lo + 1e-6

        def xy(step: float, log_loss: float) -> tuple[float, float]:
            x = left + (step - steps[0]) / max(steps[-1] - steps[0], 1) * (right - left)
            return x, bottom - (log_loss - lo) / (hi - lo) * (bottom - top)

        draw.line([xy(s, v) for s, v in zip(steps, logs)], fill=(31, 119, 180), width=2)
        draw.text((4, top), f"{10**hi:.3g}", fill="black")
        draw.text((4, bottom - 10), f"{10**lo:.3g}", fill="black")
        draw.text((left, bottom + 6), str(steps[0]), fill="black")
        draw.text((right - 40, bottom + 6), str(steps[-1]), fill="black")
    draw.text(((left + right) // 2 - 40, size[1] - 18), "step (loss, log scale)", fill="black")
    image.save(path)
