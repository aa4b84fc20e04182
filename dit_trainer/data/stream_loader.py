"""The loader of a stream (webdataset, a mixture with one), whose position a checkpoint keeps for each process.

torchdata's ``StatefulDataLoader`` does the hard part: it keeps each worker's stream state (``ShardStream`` and
``MixedStream`` implement ``state_dict``/``load_state_dict``) as of the last batch handed to the trainer, not as
of what the workers have prefetched, and which worker's batch comes next. This adds the epoch and what the
position is only valid for (the number of workers, which with the processes decides each worker's shards), so a
resumed run opens each worker's shard at its place instead of reading and dropping every batch since step 0.

What each worker's position is valid for (its shard list, the shards it reads again, a mixture's sources) is checked
here, in the main process, before any worker starts (``resume_state``, see ``stream_changes``): a refusal is one
paragraph from the main process, and with ``allow_config_change`` the changed streams start their epoch again.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any, Protocol

from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.incremental_state import _DATASET_ITER_STATE, _FETCHER_STATE, _WORKER_ID

from dit_trainer.errors import ConfigError, shortlist

logger = logging.getLogger(__name__)


class ResumableStream(Protocol):
    """A stream whose saved worker positions can be checked against its data now (``WebDatasetSource``,
    ``StreamMixture``): the state to load and what changed (refused unless ``allow_change``)."""

    def resume_state(
        self, state: dict[str, Any], worker: int, workers: int, allow_change: bool
    ) -> tuple[dict[str, Any], list[str]]: ...


def worker_positions(loader_state: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(worker id, the dict holding its stream's state under torchdata's key) for each worker of a
    ``StatefulDataLoader.state_dict`` (the main process is worker 0 without workers)."""
    for key, value in loader_state.items():
        if key == _FETCHER_STATE and isinstance(value, dict) and value.get(_DATASET_ITER_STATE) is not None:
            yield loader_state.get(_WORKER_ID, 0), value
        elif isinstance(value, dict):
            yield from worker_positions(value)


class StreamLoader(StatefulDataLoader):
    """``epoch`` is the stream's current epoch (``training.batches`` sets it); ``restored`` says whether a saved
    position was loaded, so the next ``iter`` continues it. ``allow_config_change`` (``trainer.*``): a saved
    position on changed data starts the changed streams' epoch again instead of being refused."""

    def __init__(
        self, dataset: IterableDataset | ResumableStream, allow_config_change: bool = False, **options: Any
    ) -> None:
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            super().__init__(dataset, **options)
        self.allow_config_change = allow_config_change
        self.epoch = 0
        self.restored = False

    def process_states(self) -> dict[str, StreamLoader]:
        """This process's stream position, by its name in a checkpoint's per-process state."""
        return {"data_stream": self}

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "workers": self.num_workers,
            "loader": super().state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state``; one saved with another number of workers is refused: each worker's share of the
        shards depends on it (and on the number of processes, which the checkpoint's own check keeps)."""
        if state["workers"] != self.num_workers:
            raise ConfigError(
                "data.num_workers",
                self.num_workers,
                f"the checkpoint's stream position was saved with `data.num_workers={state['workers']}`, and a "
                "stream splits its shards by process and worker, so the saved places do not exist with another count",
                f"resume with `data.num_workers={state['workers']}`, or start a fresh run in a new `hydra.run.dir`",
            )
        changes = []
        for worker, holder in worker_positions(state["loader"]):
            holder[_DATASET_ITER_STATE], found = self.dataset.resume_state(
                holder[_DATASET_ITER_STATE], worker, max(self.num_workers, 1), self.allow_config_change
            )
            changes += found
        if changes:
            logger.warning(
                "The stream's data changed since the checkpoint (%s): as `trainer.allow_config_change=true` allows, "
                "each changed stream starts its epoch again on the current data (an added mixture source its first "
                "one), so samples already trained on in this epoch may come again.",
                shortlist(sorted(set(changes)), 5, "; "),
            )
        super().load_state_dict(state["loader"])
        self.epoch = state["epoch"]
        self.restored = True
