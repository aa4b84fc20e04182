"""How many images per second the training data loader delivers: the numbers behind ``data.num_workers`` and
``data.prefetch_factor`` (``python scripts/benchmark.py --loader ...``, which ``benchmark.run_loader_benchmark`` sets
against how many the trainer's step consumes).

The loader is the run's own (``build_dataloader`` over the configured source, in buckets when configured), read
without the model; the trainer's step is ``Trainer.step`` encoding every batch, as a run without a cache does.
A loader keeps up when its images/s exceed the step's: on a GPU the step is many times faster than on this CPU, so
the per-worker rate is the number to carry over (workers needed = the GPU's images/s / one worker's).
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from dit_trainer.config import DataConfig, TrainerConfig
from dit_trainer.data.buckets import BucketTable, bucketed
from dit_trainer.data.loading import build_dataloader, drawn_per_item
from dit_trainer.data.sources.source import build_dataset


def loader_images_per_second(
    data: DataConfig, trainer: TrainerConfig, buckets: BucketTable | None, workers: int, batches: int
) -> float:
    """Images/s of the run's training loader (of ``data``'s source, in the run's ``buckets``) with ``workers``
    worker processes, over ``batches`` batches after the first (which pays for starting the workers)."""
    data = replace(data, num_workers=workers, cache_latents=False, cache_dir=None)
    source = drawn_per_item(data, bucketed(build_dataset(data), buckets, trainer.batch_size, True), trainer.seed)
    iterator = iter(build_dataloader(data, trainer, source, torch.device("cpu")))
    next(iterator)
    start, images = time.perf_counter(), 0
    for _, batch in zip(range(batches), iterator):
        images += len(batch["caption"])
    return images / (time.perf_counter() - start)
