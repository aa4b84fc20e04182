"""Random augmentation that a resumed run draws again alike.

A random crop, a flip, one caption of several or a clip's start is drawn when a file is read, in a DataLoader
worker. The worker's generator is seeded when the worker starts and advances with every item it reads, so after a
resume (fresh workers, batches skipped, another worker reading each batch) the same item is cut differently, and a
``set_epoch`` on the data set never reaches the copy a persistent worker holds. So the sampler asks for a *key*,
``round * len + index`` (the round: the epoch, and which of an epoch's copies of the item it is, or DP's step), and
``SeededItems`` reads item ``index`` with torch's generator seeded by (seed, round, index): each item's draws are
its own and its round's, wherever it is read. A plain index is a key of round 0 (what a cache's encoding reads).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from dit_trainer.data.sources.streams import seeded_draws


class SeededItems(Dataset):
    """The items of ``dataset`` by key (see the module): item ``key % len`` drawn as in round ``key // len``."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: int) -> dict[str, Any]:
        round_, index = divmod(key, len(self.dataset))
        with seeded_draws(self.seed, round_, index):
            return self.dataset[index]


def item_key(index: int, round_: int, length: int) -> int:
    """The key a sampler asks ``SeededItems`` of ``length`` items for, to read item ``index`` in round ``round_``."""
    return round_ * length + index
