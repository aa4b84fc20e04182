"""A run's training data, from source to DataLoader: the disk cache or the source (one, or a mixture), less the
validation images it holds out, in buckets when configured, optionally encoded once into memory, and batched by
the loader that fits it (a seeded batch plan for buckets and mixtures, a plain shuffle, or the stream's own order).
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from torch.utils.data import DataLoader, Dataset, IterableDataset

from dit_trainer.config import DataConfig, MixtureSource, TrainerConfig, ValidationConfig
from dit_trainer.data.bad_files import PassBadFiles
from dit_trainer.data.batch_plan import BatchPlan, PlanBatchSampler
from dit_trainer.data.buckets import BucketedStream, BucketTable, bucketed, item_buckets, require_table_of
from dit_trainer.data.cache.cache import CacheDataset
from dit_trainer.data.cache.latent_cache import LatentDataset, encode_dataset
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.mixture import StreamMixture, item_sources, source_names
from dit_trainer.data.seeded_items import SeededItems
from dit_trainer.data.sources.source import build_dataset, reads_at_random
from dit_trainer.data.split import split_validation
from dit_trainer.data.stream_loader import StreamLoader
from dit_trainer.errors import ConfigError

logger = get_logger(__name__)


def require_full_batches(items: int, batch_size: int, processes: int, held_out: int = 0) -> None:
    """Every process needs one complete batch: the loaders drop an incomplete last batch (and Poisson sampling
    draws ``batch_size`` on average), so a smaller data set would train on nothing, or fail deep in the loop.
    ``held_out``: the items validation keeps out of ``items``' data set."""
    if items >= batch_size * processes:
        return
    largest = items // processes
    per_process = f" per process x {processes} processes" if processes > 1 else ""
    held = f" to train on ({held_out} more are held out for validation)" if held_out else ""
    raise ConfigError(
        "trainer.batch_size",
        batch_size,
        f"the data set has {items} items{held}, fewer than one batch of {batch_size}{per_process}, and incomplete "
        "batches are dropped",
        f"set `trainer.batch_size={largest}` or lower, or add data" if largest else "add data (or use fewer processes)",
    )


def build_source(
    data: DataConfig,
    validation: ValidationConfig,
    batch_size: int,
    seed: int,
    buckets: BucketTable | None,
    cache: CacheDataset | None,
    accelerator: Accelerator,
    sizes_dir: Path | None = None,
) -> tuple[Dataset, Dataset | None]:
    """What a run trains on, and the validation images it holds out (None: no validation), read top to bottom:
    the disk ``cache`` (opened by the caller, with its prompts; ``cache.open_cache``) or the source, in ``buckets``
    (the run's table, ``components.geometry.configured_buckets``; None: squares), less what validation holds out,
    checked to give every process a complete batch of ``batch_size`` before any model is built, its random crops
    and flips drawn by item and epoch from ``seed`` (``SeededItems``). ``sizes_dir``: the run's folder for the sizes
    index of bucketed data (``image_sizes``)."""
    require_table_of(data.buckets, buckets)
    if (cache is None) == bool(data.cache_dir):  # the caller's mistake: it would train on the images, or no cache
        raise ValueError(f"cache {cache} for data.cache_dir={data.cache_dir!r}: pass assemble.open_run_cache's")
    if cache is not None:  # encoded in its own buckets, which its fingerprint showed to be these
        source, table = cache, cache.table
    else:  # a stream in buckets batches itself, dropping incomplete batches as the loader would
        source, table = build_dataset(data), buckets
        if hasattr(source, "check_shares"):  # a stream that splits its shards between the processes
            source.check_shares()
        source = bucketed(source, table, batch_size, True, accelerator.is_main_process, sizes_dir)
    dataset, held_out = split_validation(data, validation, source, table)
    if not isinstance(dataset, IterableDataset):  # a stream's length is unknown: `resumable_batches` checks it
        held = len(held_out) if held_out is not None and validation.split else 0
        require_full_batches(len(dataset), batch_size, accelerator.num_processes, held)
    if isinstance(dataset, StreamMixture):
        dataset.check_split(data.num_workers)
    in_buckets, sources = item_buckets(dataset), item_sources(dataset)
    if in_buckets is not None:
        report_buckets(in_buckets, table, batch_size, accelerator.num_processes)
    if sources is not None:
        report_mixture(sources, data.mixture)
    return (dataset if cache is not None else drawn_per_item(data, dataset, seed)), held_out


def drawn_per_item(data: DataConfig, dataset: Dataset, seed: int) -> Dataset:
    """``dataset`` read through ``SeededItems`` when its items make random choices (``reads_at_random``): drawn by
    item and epoch from ``seed``, as a resume draws them again (a stream draws so by itself)."""
    if isinstance(dataset, IterableDataset) or not reads_at_random(data):
        return dataset
    return SeededItems(dataset, seed)


def report_mixture(sources: list[int], mixture: list[MixtureSource]) -> None:
    """Log each source's images and the share of every epoch its weight gives it."""
    counts, total = Counter(sources), sum(entry.weight for entry in mixture)
    described = ", ".join(
        f"{name}: {counts[k]} images, {entry.weight / total:.0%} of each epoch"
        for k, (name, entry) in enumerate(zip(source_names(mixture), mixture))
    )
    logger.info(f"data mixture: {described}", main_process_only=True)


def report_buckets(buckets: list[int], table: BucketTable, batch_size: int, processes: int) -> None:
    """Log how many images each bucket holds, warn about buckets too small for one batch (their images are never
    trained on), and refuse data that fills no batch per process at all."""
    logger.info(f"aspect-ratio buckets (height x width: images): {table.describe(buckets)}", main_process_only=True)
    counts = Counter(buckets)
    small = {bucket: count for bucket, count in counts.items() if count < batch_size}
    if small:
        names = ", ".join(f"{table.sizes[b][0]}x{table.sizes[b][1]} ({n})" for b, n in sorted(small.items()))
        logger.warning(
            f"{sum(small.values())} images sit in buckets smaller than one batch of {batch_size} and are never "
            f"trained on: {names}. Lower `trainer.batch_size` or list fewer buckets in `data.buckets`.",
            main_process_only=True,
        )
    batches = sum(count // batch_size for count in counts.values())
    if batches < processes:
        raise ConfigError(
            "trainer.batch_size",
            batch_size,
            f"the buckets ({table.describe(buckets)}) fill {batches} complete batches of {batch_size}, fewer than "
            f"one per process ({processes})",
            "lower `trainer.batch_size`, list fewer buckets in `data.buckets`, or add data",
        )


def build_training_data(data: DataConfig, accelerator: Accelerator, vae, source: Dataset) -> Dataset:
    """``source``, or with ``data.cache_latents`` its posteriors kept in memory (a disk cache holds them already),
    encoded unless too many of its files are unreadable (``data.max_bad_fraction``)."""
    if not data.cache_latents or data.cache_dir:
        return source
    return encode_dataset(
        source,
        vae,
        accelerator.device,
        num_workers=loader_workers(data.num_workers, source),
        show_progress=accelerator.is_main_process,
        bad_files=PassBadFiles.over(data, source),
    )


def cpus_per_process() -> int:
    """The CPUs this process may run on (its affinity: what taskset, a container or SLURM's cpus-per-task allow),
    shared among the training processes of this machine (``LOCAL_WORLD_SIZE``, set by torchrun and accelerate launch,
    whose processes inherit one affinity)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def loader_workers(configured: int, dataset: Dataset) -> int:
    """``data.num_workers``, lowered to this process's share of the CPUs with a warning: more workers than CPUs only
    contend for them (torch warns as well). A stream keeps the configured count, warned: its shard split and the
    position a checkpoint saves are per worker, so its count must not change with the machine it resumes on."""
    cpus = cpus_per_process()
    if configured <= cpus:
        return configured
    streamed = isinstance(dataset, IterableDataset)
    _warn_too_many_workers(configured, cpus, streamed)
    return configured if streamed else cpus


@functools.cache
def _warn_too_many_workers(configured: int, cpus: int, streamed: bool) -> None:
    """Once per process: the training, validation and preview loaders all ask ``loader_workers``."""
    action = (
        "kept, as a stream's shard split and its saved position are per worker"
        if streamed
        else f"using {cpus} data-loader workers"
    )
    logger.warning(
        f"`data.num_workers={configured}` is more than the {cpus} CPUs this process may use (its CPU affinity, shared "
        f"by the training processes of this machine): {action}. Set `data.num_workers={cpus}` to fit this machine.",
        main_process_only=True,
    )


def loader_options(data: DataConfig, dataset: Dataset, device: torch.device) -> dict:
    """Worker processes when the items need decoding (an in-memory latent cache does not; at most this process's
    share of the CPUs: ``loader_workers``), pinned memory for CUDA, workers kept alive across epochs."""
    workers = 0 if isinstance(dataset, LatentDataset) else loader_workers(data.num_workers, dataset)
    return {
        "num_workers": workers,
        "pin_memory": device.type == "cuda",
        "persistent_workers": workers > 0 and not isinstance(dataset, IterableDataset),  # set_epoch reaches workers
        "prefetch_factor": data.prefetch_factor if workers > 0 else None,
    }


def release_workers(dataloader: DataLoader) -> None:
    """Shut down the worker processes that ``loader_options`` keeps alive across epochs, now that nothing reads
    ``dataloader`` any more. Left to torch, they end when the loader is collected: late for a loader held in a
    reference cycle (a trainer's), and then each worker waits out a 5-s join, its queues finalized before it."""
    loader = getattr(dataloader, "base_dataloader", dataloader)  # the one inside accelerate's wrapper
    if loader.persistent_workers and loader._iterator is not None:  # where torch keeps them
        loader._iterator._shutdown_workers()
        loader._iterator = None  # a later reading starts workers of its own


def build_dataloader(data: DataConfig, trainer: TrainerConfig, dataset: Dataset, device: torch.device) -> DataLoader:
    """Map-style data sets are shuffled (in buckets, mixed from several sources or read with random draws, by a
    seeded plan whose every batch is one bucket, whose epochs draw each source by its weight, and which asks
    ``SeededItems`` for each item by its key in the epoch); an iterable one (webdataset, a mixture
    with one) shuffles and splits its shards itself, and its loader's position goes into checkpoints, per process
    (``StreamLoader``), checked against the data at a resume (``trainer.allow_config_change``: restarted instead of
    refused). ``trainer``: the batch size, the seed and ``allow_config_change``."""
    options = loader_options(data, dataset, device)
    if isinstance(dataset, BucketedStream):  # it yields whole batches
        return DataLoader(dataset, batch_size=None, collate_fn=collate_batch, **options)
    if isinstance(dataset, IterableDataset):  # its position is saved in checkpoints, per process
        return StreamLoader(
            dataset,
            trainer.allow_config_change,
            batch_size=trainer.batch_size,
            drop_last=True,
            collate_fn=collate_batch,
            **options,
        )
    buckets, sources = item_buckets(dataset), item_sources(dataset)
    seeded = isinstance(dataset, SeededItems)
    # A cache of a source that reads at random (a video's clip starts) is read in that source's order too.
    if buckets is not None or sources is not None or seeded or reads_at_random(data):
        weights = [entry.weight for entry in data.mixture] or None
        buckets = buckets or [0] * len(dataset)
        plan = BatchPlan(buckets, trainer.batch_size, trainer.seed, sources, weights)
        sampler = PlanBatchSampler(plan, keyed=seeded)
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_batch, **options)
    return DataLoader(
        dataset, batch_size=trainer.batch_size, shuffle=True, drop_last=True, collate_fn=collate_batch, **options
    )
