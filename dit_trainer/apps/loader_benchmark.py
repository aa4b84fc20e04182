"""How many images per second the training data loader delivers, against how many the trainer's step consumes:
the numbers behind ``data.num_workers`` and ``data.prefetch_factor`` (``python scripts/benchmark.py --loader ...``).

The loader is the run's own (``build_dataloader`` over the configured source, in buckets when configured), read
without the model; the trainer's step is ``Trainer.step`` encoding every batch, as a run without a cache does.
A loader keeps up when its images/s exceed the step's: on a GPU the step is many times faster than on this CPU, so
the per-worker rate is the number to carry over (workers needed = the GPU's images/s / one worker's).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from dit_trainer.apps.benchmark import measure, trainer_step
from dit_trainer.components.geometry import configured_buckets
from dit_trainer.config import TrainConfig
from dit_trainer.data.buckets import bucketed
from dit_trainer.data.loading import build_dataloader
from dit_trainer.data.sources.source import build_dataset


def loader_images_per_second(cfg: TrainConfig, workers: int, batches: int) -> float:
    """Images/s of the run's training loader with ``workers`` worker processes, over ``batches`` batches after the
    first (which pays for starting the workers)."""
    cfg = replace(cfg, data=replace(cfg.data, num_workers=workers, cache_latents=False, cache_dir=None))
    source = bucketed(
        build_dataset(cfg.data), configured_buckets(cfg.model, cfg.vae, cfg.data), cfg.trainer.batch_size, True
    )
    iterator = iter(build_dataloader(cfg.data, cfg.trainer, source, torch.device("cpu")))
    next(iterator)
    start, images = time.perf_counter(), 0
    for _, batch in zip(range(batches), iterator):
        images += len(batch["caption"])
    return images / (time.perf_counter() - start)


def run_loader_benchmark(cfg: TrainConfig, out_dir: Path, workers: list[int], batches: int, steps: int) -> dict:
    """The loader's images/s at each worker count and the trainer's (uncached) step's; writes ``out_dir/loader.json``
    and returns it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    loader = {str(count): loader_images_per_second(cfg, count, batches) for count in workers}
    quiet = replace(cfg.trainer, sample_every=0, log_every=10**9, checkpoint_every=0, resume=None, max_steps=10**9)
    data = replace(cfg.data, cache_dir=None, cache_latents=False)
    uncached = replace(
        cfg, trainer=quiet, data=data, monitor=replace(cfg.monitor, reward=replace(cfg.monitor.reward, enabled=False))
    )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    step = measure({"trainer": trainer_step(uncached, out_dir / "trainer")}, cfg.trainer.batch_size, 2, steps, device)
    report = {
        "loader_img_s_by_workers": loader,
        "trainer_uncached_img_s": step[0].images_per_sec,
        "batch_size": cfg.trainer.batch_size,
        "resolution": cfg.data.resolution,
        "prefetch_factor": cfg.data.prefetch_factor,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    (out_dir / "loader.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def format_loader_table(report: dict) -> str:
    lines = [f"{'data.num_workers':<18}{'loader img/s':>14}{'x trainer step':>16}"]
    trainer = report["trainer_uncached_img_s"]
    for workers, speed in report["loader_img_s_by_workers"].items():
        lines.append(f"{workers:<18}{speed:>14.1f}{speed / trainer:>16.1f}")
    lines.append(f"trainer step (encoding every batch, {report['device']}): {trainer:.1f} img/s")
    return "\n".join(lines)
