"""Which items form each batch of an epoch when batches must be single-bucket or sources mixed by weight.

Each epoch, for every (source, bucket) pool, a fixed quota of its items is drawn (a fresh seeded permutation, cycled
when the quota exceeds the pool); each bucket's drawn items are shuffled and cut into full batches, and the batches
of all buckets are shuffled together. Quotas depend only on the pool sizes and the weights, so every epoch has the
same number of batches: the trainer's resume (epoch, batches to skip) lands on exactly the batch it stopped at. A
source of weight w gets w / sum(weights) of each epoch's items in expectation (a single source: every item once).

``PlanBatchSampler`` is the plan as a ``torch`` batch sampler. accelerate shards it across processes (process r
takes every r-th batch of each group of ``num_processes``) and forwards ``set_epoch`` to it. Over ``SeededItems`` it
asks for keys, so that each item's random crop or flip is its epoch's (and its copy's, for an item drawn twice).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

from dit_trainer.data.seeded_items import item_key


def pool_quotas(pools: dict[tuple[int, int], int], weights: Sequence[float]) -> dict[tuple[int, int], int]:
    """Items drawn per epoch from each (source, bucket) pool of ``pools[(source, bucket)]`` items: a source's share
    of the epoch is its weight's share of all weights, split over its buckets in proportion to their sizes."""
    total = sum(pools.values())
    per_source = [sum(n for (s, _), n in pools.items() if s == source) for source in range(len(weights))]
    quotas = {}
    for (source, bucket), size in pools.items():
        source_items = total * weights[source] / sum(weights)
        quotas[(source, bucket)] = round(source_items * size / per_source[source])
    return quotas


class BatchPlan:
    """Epoch ``e``'s batches (lists of item indices), a function of ``seed`` and ``e`` only."""

    def __init__(
        self,
        buckets: Sequence[int],
        batch_size: int,
        seed: int,
        sources: Sequence[int] | None = None,
        weights: Sequence[float] | None = None,
    ) -> None:
        sources = sources if sources is not None else [0] * len(buckets)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.items = len(buckets)
        members: dict[tuple[int, int], list[int]] = {}
        for index, key in enumerate(zip(sources, buckets)):
            members.setdefault(key, []).append(index)
        self.pools = {key: torch.tensor(members[key]) for key in sorted(members)}
        sizes = {key: len(items) for key, items in self.pools.items()}
        self.quotas = pool_quotas(sizes, weights or [1.0] * (max(sources) + 1))
        per_bucket: dict[int, int] = {}
        for (_, bucket), quota in self.quotas.items():
            per_bucket[bucket] = per_bucket.get(bucket, 0) + quota
        self.batches_per_bucket = {bucket: count // batch_size for bucket, count in sorted(per_bucket.items())}
        # An item is drawn up to this many times an epoch (a small source weighted up cycles its pool).
        self.copies = max((-(-quota // sizes[key]) for key, quota in self.quotas.items() if quota), default=1)

    def __len__(self) -> int:
        return sum(self.batches_per_bucket.values())

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        generator = torch.Generator().manual_seed((self.seed << 32) + self.epoch)
        drawn: dict[int, list[torch.Tensor]] = {}
        for (source, bucket), items in self.pools.items():
            quota = self.quotas[(source, bucket)]
            if not quota:  # a pool too small for its source's share to round to one item (a lone wide image)
                continue
            rounds = -(-quota // len(items))
            order = torch.cat([items[torch.randperm(len(items), generator=generator)] for _ in range(rounds)])
            drawn.setdefault(bucket, []).append(order[:quota])
        batches = []
        for bucket, parts in sorted(drawn.items()):
            items = torch.cat(parts)
            items = items[torch.randperm(len(items), generator=generator)]
            full = self.batches_per_bucket[bucket] * self.batch_size
            batches += items[:full].view(-1, self.batch_size).tolist() if full else []
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


class PlanBatchSampler(Sampler[list[int]]):
    """A ``BatchPlan`` as the DataLoader's ``batch_sampler``. ``sampler`` is the plan itself: accelerate's sharded
    loader calls ``set_epoch`` on its batch sampler's ``sampler``. ``keyed``: the batches name their items by their
    ``SeededItems`` keys in the epoch."""

    drop_last = True

    def __init__(self, plan: BatchPlan, keyed: bool = False) -> None:
        self.sampler = plan
        self.batch_size = plan.batch_size
        self.keyed = keyed

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[list[int]]:
        plan, drawn = self.sampler, Counter()
        for batch in plan.batches():
            if not self.keyed:
                yield batch
                continue
            keys = []
            for index in batch:  # each copy of an item in the epoch is its own round: cut, flipped anew
                keys.append(item_key(index, plan.epoch * plan.copies + drawn[index], plan.items))
                drawn[index] += 1
            yield keys
