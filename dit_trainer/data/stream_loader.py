"""The loader of a stream (webdataset, a mixture with one), whose position a checkpoint keeps for each process.

torchdata's ``StatefulDataLoader`` does the hard part: it keeps each worker's stream state (``ShardStream`` and
``MixedStream`` implement ``state_dict``/``load_state_dict``) as of the last batch handed to the trainer, not as
of what the workers have prefetched, and which worker's batch comes next. This adds the epoch and what the
position is only valid for (the number of workers, which with the processes decides each worker's shards), so a
resumed run opens each worker's shard at its place instead of reading and dropping every batch since step 0.
"""

from __future__ import annotations

import warnings
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader

from dit_trainer.errors import ConfigError


class StreamLoader(StatefulDataLoader):
    """``epoch`` is the stream's current epoch (``training.batches`` sets it); ``restored`` says whether a saved
    position was loaded, so the next ``iter`` continues it."""

    def __init__(self, dataset, **options: Any) -> None:
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            super().__init__(dataset, **options)
        self.epoch = 0
        self.restored = False

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
        super().load_state_dict(state["loader"])
        self.epoch = state["epoch"]
        self.restored = True
