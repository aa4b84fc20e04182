"""Poisson-sampled batches (``data/poisson.py``): reproducible per step, of varying size, possibly empty."""

import torch

from dit_trainer.data.poisson import PoissonBatchSampler


def test_poisson_batches_are_reproducible_per_step_and_may_be_empty():
    sampler = PoissonBatchSampler(num_samples=1000, steps_per_epoch=100, seed=3)
    first = list(sampler)
    sizes = torch.tensor([len(b) for b in first], dtype=torch.float)
    assert sizes.std() > 0 and 7 < sizes.mean() < 13  # expected size 10, varying
    resumed = PoissonBatchSampler(num_samples=1000, steps_per_epoch=100, seed=3)
    resumed.next_step = 40
    assert next(iter(resumed)) == first[40]
    assert list(PoissonBatchSampler(num_samples=3, steps_per_epoch=100, seed=0))[0] == []  # q = 0.01


def test_keyed_batches_name_each_drawn_item_by_its_step():
    plain, keyed = PoissonBatchSampler(10, 3, seed=1), PoissonBatchSampler(10, 3, seed=1, keyed=True)
    for step, (indices, keys) in enumerate(zip(plain, keyed)):
        assert keys == [step * 10 + index for index in indices]
