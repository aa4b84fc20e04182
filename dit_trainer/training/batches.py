"""Endless batches that continue where a resumed run stopped, for each kind of loader the trainer builds:
map-style (shuffled per epoch: skip into the epoch), streamed (webdataset, a mixture with one: continue at the
position the checkpoint saved, or without one read and drop what was trained on) and Poisson-sampled (DP: step
``s``'s draw depends only on ``s``). A shuffled map-style order's place is also kept as a ``DataPosition``, so a
resume in other batches (another batch size, accumulation or number of processes) continues at the same image; a
``BatchPlan``'s batches depend on the batch size, so there another batch size continues at the same share of the
epoch."""

from __future__ import annotations

from collections.abc import Iterator

from accelerate import Accelerator
from accelerate.logging import get_logger
from torch.utils.data import DataLoader, IterableDataset

from dit_trainer.data.batch_plan import PlanBatchSampler
from dit_trainer.data.loading import release_workers
from dit_trainer.data.poisson import PoissonBatchSampler
from dit_trainer.data.stream_loader import StreamLoader
from dit_trainer.errors import ConfigError
from dit_trainer.training.state.training_state import DataPosition

logger = get_logger(__name__)


def resumable_batches(
    dataloader: DataLoader, accelerator: Accelerator, micro_steps: int, data_path: str | None = None
) -> Iterator[dict]:
    """Batches from micro-step ``micro_steps`` (steps x gradient accumulation) of the data order on; ``data_path``
    is named when a streamed source gives no batch at all. The loader's workers end with the reading."""
    if isinstance(dataloader.batch_sampler, PoissonBatchSampler):
        batches = _poisson_batches(dataloader, micro_steps)
    elif isinstance(dataloader.dataset, IterableDataset):
        batches = _stream_batches(dataloader, micro_steps, data_path)
    else:
        batches = _map_batches(dataloader, accelerator, micro_steps)
    return _releasing_workers(dataloader, batches)


def _releasing_workers(dataloader: DataLoader, batches: Iterator[dict]) -> Iterator[dict]:
    """``batches``, whose end (closed, or dropped by its reader) shuts ``dataloader``'s persistent workers down."""
    try:
        yield from batches
    finally:
        release_workers(dataloader)


def continued_micro_steps(dataloader: DataLoader, micro_steps: int, position: DataPosition | None) -> int:
    """The micro-step a resumed run's data order continues at: ``position`` (a checkpoint's, perhaps written in
    other batches) in this loader's batches, else ``micro_steps`` (the steps' count; a stream and a Poisson draw keep
    their own place)."""
    if position is None or not _shuffled(dataloader):
        return micro_steps
    if _planned(dataloader) and position.batch_size != dataloader.batch_sampler.batch_size:
        logger.warning(
            f"The data are cut into batches of `trainer.batch_size` images by a plan (buckets or a mixture): "
            f"resumed with {dataloader.batch_sampler.batch_size} instead of {position.batch_size}, epoch "
            f"{position.epoch} is planned anew and continues after the same share of it, so until it ends some "
            "images are read twice and others not at all.",
            main_process_only=True,
        )
    return position.micro_steps(len(dataloader), _images_per_batch(dataloader))


def data_position(dataloader: DataLoader, micro_steps: int) -> DataPosition | None:
    """Micro-step ``micro_steps`` of a shuffled map-style loader's order as a ``DataPosition`` (None otherwise)."""
    if not _shuffled(dataloader):
        return None
    epoch, batches = divmod(micro_steps, len(dataloader))
    return DataPosition(epoch, batches, _images_per_batch(dataloader), dataloader.batch_sampler.batch_size)


def _shuffled(dataloader: DataLoader) -> bool:
    return not isinstance(dataloader.dataset, IterableDataset) and not isinstance(
        dataloader.batch_sampler, PoissonBatchSampler
    )


def _planned(dataloader: DataLoader) -> bool:
    """Whether a ``BatchPlan`` cuts the batches (accelerate's sharded loader wraps it): its batches, unlike a
    shuffle's, depend on the batch size."""
    sampler = dataloader.batch_sampler
    return isinstance(getattr(sampler, "batch_sampler", sampler), PlanBatchSampler)


def _images_per_batch(dataloader: DataLoader) -> int:
    """Images in one micro-batch over all processes (accelerate's sharded loader knows them; a plain one is one
    process's)."""
    return getattr(dataloader, "total_batch_size", None) or dataloader.batch_sampler.batch_size


def _poisson_batches(dataloader: DataLoader, step: int) -> Iterator[dict]:
    dataloader.batch_sampler.next_step = step
    while True:
        yield from dataloader


def _map_batches(dataloader: DataLoader, accelerator: Accelerator, micro_steps: int) -> Iterator[dict]:
    epoch, skip = divmod(micro_steps, len(dataloader))
    while True:
        dataloader.set_epoch(epoch)
        loader = accelerator.skip_first_batches(dataloader, skip) if skip else dataloader
        yield from loader
        epoch, skip = epoch + 1, 0


def _stream_batches(dataloader: DataLoader, skip: int, data_path: str | None) -> Iterator[dict]:
    """A stream continues at the position its checkpoint saved (``StreamLoader.restored``). Without one (a
    checkpoint from before streams saved it, or a bucketed stream, whose batches are assembled across samples) it
    reads and drops the batches already trained on: the same order, as the shard shuffle is seeded by the epoch,
    but at the cost of reading everything since step 0."""
    restored = isinstance(dataloader, StreamLoader) and dataloader.restored
    epoch, skip = (dataloader.epoch, 0) if restored else (0, skip)
    if restored:
        dataloader.restored = False  # its next iterator continues the saved position, the ones after start afresh
    if skip:
        logger.warning(
            f"The checkpoint holds no stream position for this data: reading and dropping the {skip} batches "
            "already trained on before the first step (this takes as long as reading them did).",
            main_process_only=True,
        )
    while True:
        if isinstance(dataloader, StreamLoader):
            dataloader.epoch = epoch
        dataloader.dataset.set_epoch(epoch)
        batches = 0
        for batch in dataloader:
            batches += 1
            if skip:
                skip -= 1
                continue
            yield batch
        if batches == 0 and not restored:  # a restored position may stand at the end of its epoch
            raise ConfigError(
                "data.path",
                data_path,
                "an epoch of it gave this process no complete batch (of `trainer.batch_size` images, of one "
                "bucket with `data.buckets`)",
                "check the shards (and that there are at least as many as processes x workers), or lower "
                "`trainer.batch_size`",
            )
        epoch, restored = epoch + 1, False
