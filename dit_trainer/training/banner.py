"""The start banner: one block, logged before step 1, that says what the run will do and where everything goes
(``python train.py +experiment=shapes trainer.max_steps=200 ...``)::

    Starting the run:
      Run folder   /home/me/dit-trainer/outputs/2026-11-26/10-14-03.512345
      Processes    1 process on cpu (no GPU found)
      Precision    fp32 (auto: no CUDA GPU, and bf16 autocast is slower than fp32 on a CPU)
      Data         7744 items (+ 256 validation images held out) at 32 px; 121 steps per epoch
      Batch        64 images per step = 64 per process x 1 accumulation step x 1 process
      Steps        200 (about 1.65 epochs), from step 0; a log line every 25
      Checkpoints  every 100 steps and at the end, into .../checkpoints (all kept)
      Monitors     sample grid every 100 steps; validation loss every 100 steps; reward monitor every 100 steps
      Metrics      .../metrics.jsonl, loss lines in train.log
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from accelerate import Accelerator
from accelerate.logging import get_logger
from torch.utils.data import Dataset, IterableDataset

from dit_trainer.config import DataConfig, MonitorConfig, PrecisionConfig, TrainerConfig, ValidationConfig
from dit_trainer.data.buckets import item_buckets
from dit_trainer.data.mixture import item_sources
from dit_trainer.precision import choose_mixed_precision
from dit_trainer.training.launch import describe_processes
from dit_trainer.training.trainer import Trainer

logger = get_logger(__name__)


@dataclass(frozen=True)
class DataShape:
    """What the banner says of the training data: its size, and the optimizer steps one pass over it takes."""

    described: str
    steps_per_epoch: int | None


def describe_data(
    data: DataConfig,
    trainer: TrainerConfig,
    validation: ValidationConfig,
    dataset: Dataset | None,
    held_out: Dataset | None,
    processes: int,
    inputs: str | None = None,
) -> DataShape:
    """``224 items (+ 32 validation images held out) in 6 buckets; 7 steps per epoch``, a stream, or ``inputs``: the
    method's own words for what it trains on when that is not a data set (GRPO's rollouts)."""
    t, accumulation = trainer, trainer.gradient_accumulation_steps
    if inputs is not None:
        return DataShape(inputs, None)
    if dataset is None or isinstance(dataset, IterableDataset):
        sources = data.path or ", ".join(entry.path or entry.source for entry in data.mixture)
        return DataShape(f"a stream from {sources} (its length is unknown until read)", None)
    items, held = len(dataset), ""
    if held_out is not None and not isinstance(held_out, IterableDataset):
        where = "held out" if validation.split else f"from {validation.path}"
        held = f" (+ {len(held_out)} validation images {where})"
    buckets, sources = item_buckets(dataset), item_sources(dataset)
    counts = Counter(buckets or [0] * items)
    shape = f" in {len(counts)} bucket{'s' * (len(counts) > 1)}" if buckets is not None else f" at {data.resolution} px"
    shape += f", clips of {data.frames} frames" if data.frames > 1 else ""
    mixture = f", mixed from {len(set(sources))} sources" if sources is not None else ""
    batches = sum(count // t.batch_size for count in counts.values())
    steps = batches // (processes * accumulation) if sources is None else None
    per_epoch = f"; {steps} step{'s' * (steps > 1)} per epoch" if steps else ""
    return DataShape(f"{items} items{held}{shape}{mixture}{per_epoch}", steps or None)


def describe_run(
    trainer: TrainerConfig,
    precision: PrecisionConfig,
    monitor: MonitorConfig,
    validation: ValidationConfig,
    accelerator: Accelerator,
    run_dir: Path,
    data: DataShape,
    images_per_step: int,
    start_step: int,
    metrics: str,
) -> str:
    """The banner's block (module docstring); ``metrics``: where the metrics go (``Trackers.describe``)."""
    t, processes = trainer, accelerator.num_processes
    per_process = images_per_step // (t.gradient_accumulation_steps * processes)
    accumulation = t.gradient_accumulation_steps
    batch = f"{images_per_step} images per step = {per_process} per process x {accumulation} accumulation step"
    batch += f"{'s' * (accumulation > 1)} x {processes} process{'es' * (processes > 1)}"
    epochs = f" (about {t.max_steps / data.steps_per_epoch:.3g} epochs)" if data.steps_per_epoch else ""
    start = f"resuming at step {start_step}" if start_step else "from step 0"
    rows = {
        "Run folder": str(run_dir.resolve()),
        "Processes": describe_processes(accelerator),
        "Precision": choose_mixed_precision(t.mixed_precision).describe() + describe_fp8(precision),
        "Data": data.described,
        "Batch": batch,
        "Steps": f"{t.max_steps}{epochs}, {start}; a log line every {t.log_every}",
        "Checkpoints": checkpoint_cadence(trainer, run_dir),
        "Monitors": monitor_cadence(trainer, monitor, validation),
        "Metrics": metrics,
    }
    width = max(map(len, rows)) + 2
    return "Starting the run:\n" + "\n".join(f"  {name:<{width}}{value}" for name, value in rows.items())


def describe_fp8(precision: PrecisionConfig) -> str:
    if not precision.fp8:
        return ""
    return f"; the blocks' linear layers in FP8 ({precision.fp8_recipe}{', emulated' if precision.fp8_emulate else ''})"


def checkpoint_cadence(trainer: TrainerConfig, run_dir: Path) -> str:
    t = trainer
    every = f"every {t.checkpoint_every} steps and at the end" if t.checkpoint_every else "at the end only"
    kept = f"the newest {t.checkpoints_total_limit} kept" if t.checkpoints_total_limit else "all kept"
    return f"{every}, into {run_dir.resolve() / 'checkpoints'} ({kept})"


def monitor_cadence(trainer: TrainerConfig, monitor: MonitorConfig, validation: ValidationConfig) -> str:
    """The monitors and how often they pause training (each also runs at the last step)."""
    t, m = trainer, monitor
    due = [("sample grid", t.sample_every)]
    if validation.every_n_steps:
        due.append(("validation loss", validation.every_n_steps))
    if (reward_monitor := monitor.reward).enabled:
        due.append(("reward monitor", reward_monitor.every_n_steps))
    if m.fid.enabled:
        due.append(("FID", m.fid.every_n_steps))
    return "; ".join(f"{name} {f'every {every} steps' if every else 'at the end'}" for name, every in due)


def log_start_banner(
    run: Trainer,
    data: DataConfig,
    trainer: TrainerConfig,
    precision: PrecisionConfig,
    monitor: MonitorConfig,
    validation: ValidationConfig,
    dataset: Dataset | None,
    held_out: Dataset | None,
    inputs: str | None = None,
) -> None:
    """Log the banner of the ``run`` (built and resumed) on the main process: ``dataset`` is what it trains on,
    ``held_out`` its validation images, ``inputs`` what it trains on instead of a data set (``describe_data``)."""
    accelerator = run.accelerator
    if not accelerator.is_main_process:
        return
    shape = describe_data(data, trainer, validation, dataset, held_out, accelerator.num_processes, inputs)
    metrics = run.trackers.describe(run.run_dir) if run.trackers else str(run.metrics.path)
    banner = describe_run(
        trainer,
        precision,
        monitor,
        validation,
        accelerator,
        run.run_dir,
        shape,
        run.settings.images_per_step,
        run.state.step,
        metrics,
    )
    logger.info(banner, main_process_only=True)
