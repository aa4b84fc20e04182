"""The batch plan (``data/batch_plan.py``): single-bucket batches seeded per epoch, sharded across processes by
accelerate, and sources drawn by their weights."""

from collections import Counter

from accelerate.data_loader import BatchSamplerShard

from dit_trainer.data.batch_plan import BatchPlan, PlanBatchSampler


def test_the_plan_gives_single_bucket_batches_seeded_per_epoch_with_each_item_at_most_once():
    buckets = [i % 3 for i in range(50)] + [0] * 10
    plan = BatchPlan(buckets, batch_size=4, seed=7)
    epoch0 = plan.batches()
    assert len(epoch0) == len(plan) == sum(n // 4 for n in (27, 17, 16))
    assert all(len({buckets[i] for i in batch}) == 1 for batch in epoch0)
    items = [i for batch in epoch0 for i in batch]
    assert len(items) == len(set(items))
    assert epoch0 == BatchPlan(buckets, batch_size=4, seed=7).batches()
    plan.set_epoch(1)
    assert plan.batches() != epoch0 and len(plan.batches()) == len(epoch0)


def test_accelerate_shards_the_plan_into_disjoint_single_bucket_batches():
    buckets = [i % 3 for i in range(60)]
    sampler = PlanBatchSampler(BatchPlan(buckets, batch_size=4, seed=0))
    shards = [list(BatchSamplerShard(sampler, num_processes=2, process_index=rank)) for rank in (0, 1)]
    assert len(shards[0]) == len(shards[1]) > 0
    seen = [i for shard in shards for batch in shard for i in batch]
    assert len(seen) == len(set(seen))
    assert all(len({buckets[i] for i in batch}) == 1 for shard in shards for batch in shard)


def test_each_epoch_draws_the_sources_by_weight():
    sources = [0] * 40 + [1] * 40
    plan = BatchPlan([0] * 80, batch_size=4, seed=0, sources=sources, weights=[3.0, 1.0])
    for epoch in range(3):
        plan.set_epoch(epoch)
        drawn = Counter(sources[i] for batch in plan.batches() for i in batch)
        assert drawn == {0: 60, 1: 20}  # source 0's 40 items cycled to its 75 %


def test_a_pool_whose_quota_rounds_to_nothing_is_left_out_of_the_epoch():
    """Weights 3:1 and one wide image among source 1's 41: its (source, bucket) quota rounds to 0 items."""
    sources, buckets = [0] * 40 + [1] * 41, [0] * 80 + [1]
    plan = BatchPlan(buckets, batch_size=4, seed=0, sources=sources, weights=[3.0, 1.0])
    assert plan.quotas[(1, 1)] == 0
    batches = plan.batches()
    assert len(batches) == len(plan) > 0 and 80 not in {i for batch in batches for i in batch}
