"""Batches that continue where a resumed run stopped (``training/batches.py``): map-style (in the same batches, or
in others at the same image), Poisson-sampled, and a stream that yields nothing."""

import logging

import pytest
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader, Dataset, IterableDataset

from dit_trainer.data.batch_plan import BatchPlan, PlanBatchSampler
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.poisson import PoissonBatchSampler, collate_poisson
from dit_trainer.errors import ConfigError
from dit_trainer.training.batches import continued_micro_steps, data_position, resumable_batches
from dit_trainer.training.state.training_state import DataPosition


class Numbered(Dataset):
    def __init__(self, items: int = 10) -> None:
        self.items = items

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> dict:
        return {"caption": str(index)}


def _captions(batches, count: int) -> list[list[str]]:
    return [next(batches)["caption"] for _ in range(count)]


def test_map_style_batches_resume_mid_epoch_in_the_same_order():
    """Micro-step k of a resumed run reads what the uninterrupted run read at k: same shuffle, epochs included."""
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))

    def loader():
        data = DataLoader(Numbered(), batch_size=3, shuffle=True, drop_last=True, collate_fn=collate_batch)
        return accelerator.prepare_data_loader(data, device_placement=False)

    uninterrupted = _captions(resumable_batches(loader(), accelerator, 0), 8)  # 3 batches an epoch: 2 epochs+
    assert uninterrupted[0] != uninterrupted[3]  # epochs are shuffled differently
    for start in (2, 4):
        assert _captions(resumable_batches(loader(), accelerator, start), 8 - start) == uninterrupted[start:]


def test_a_loaders_persistent_workers_end_when_its_batches_are_dropped():
    """Workers kept across epochs (``loader_options``) end with the reading. Left to the loader, they lived until it
    was collected, which for a trainer's (held in a reference cycle) came at some later point, each worker then
    waiting out a 5-s join: 40 s spent inside an unrelated test of the quick loop."""
    accelerator = Accelerator(cpu=True)
    data = DataLoader(Numbered(), batch_size=3, shuffle=True, drop_last=True, collate_fn=collate_batch, num_workers=2,
                      persistent_workers=True)  # fmt: skip
    loader = accelerator.prepare_data_loader(data, device_placement=False)
    batches = resumable_batches(loader, accelerator, 0)
    assert len(_captions(batches, 4)) == 4  # into the second epoch, on the same workers
    workers = loader._iterator._workers
    assert len(workers) == 2 and all(worker.is_alive() for worker in workers)
    del batches
    assert not any(worker.is_alive() for worker in workers)
    assert _captions(resumable_batches(loader, accelerator, 0), 1)  # a later reading starts workers of its own


@pytest.mark.parametrize("batch_size", [2, 3, 8])
def test_a_resume_in_other_batches_reads_the_rest_of_the_epoch(batch_size):
    """Stopped 3 batches of 4 into epoch 1 (6 batches an epoch), a resume with another batch size (or number of
    processes: the images per micro-batch change alike) reads that epoch's images not yet read, then epoch 2; the
    step count alone (9 micro-steps of the new size) would land elsewhere."""
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))

    def loader(size: int) -> DataLoader:
        data = DataLoader(Numbered(24), batch_size=size, shuffle=True, drop_last=True, collate_fn=collate_batch)
        return accelerator.prepare_data_loader(data, device_placement=False)

    by_four = sum(_captions(resumable_batches(loader(4), accelerator, 0), 18), [])  # 3 epochs of 24 images
    position = data_position(loader(4), 9)
    assert position == DataPosition(epoch=1, batches=3, images_per_batch=4, batch_size=4)
    resumed_loader = loader(batch_size)
    start = continued_micro_steps(resumed_loader, 9, position)
    assert start != 9
    read = 12 // batch_size * batch_size  # a partial batch is read again
    rest = (48 - read) // batch_size  # batches to the end of epoch 2
    resumed = sum(_captions(resumable_batches(resumed_loader, accelerator, start), rest), [])
    assert resumed == by_four[24 + read :]


def test_a_plan_resumed_in_other_batches_warns_that_its_epoch_is_planned_anew(caplog):
    """A ``BatchPlan`` (buckets, mixtures) cuts an epoch by the batch size: another one re-plans the epoch, so the
    resume can only continue after the same share of it, and says so; the same batch size continues exactly."""
    accelerator = Accelerator(cpu=True)

    def loader(size: int) -> DataLoader:
        plan = PlanBatchSampler(BatchPlan([0] * 24, batch_size=size, seed=1))
        data = DataLoader(Numbered(24), batch_sampler=plan, collate_fn=collate_batch)
        return accelerator.prepare_data_loader(data, device_placement=False)

    position = data_position(loader(4), 3)  # 12 images into epoch 0
    with caplog.at_level(logging.WARNING):
        assert continued_micro_steps(loader(4), 3, position) == 3 and not caplog.records
        assert continued_micro_steps(loader(8), 3, position) == 1
    assert "resumed with 8 instead of 4, epoch 0 is planned anew" in caplog.text


def test_poisson_batches_resume_at_the_step():
    """Step s's draw depends only on s, so a run resumed at step 7 reads draws 7, 8, ... (an empty draw included)."""
    sampler = PoissonBatchSampler(num_samples=10, steps_per_epoch=3, seed=1)
    data = DataLoader(Numbered(), batch_sampler=sampler, collate_fn=collate_poisson)
    resumed = resumable_batches(data, Accelerator(cpu=True), 7)
    expected = [[str(i) for i in PoissonBatchSampler(10, 3, seed=1).indices(step)] for step in range(7, 13)]
    assert [next(resumed).get("caption", []) for _ in range(6)] == expected
    assert any(expected) and len(set(map(tuple, expected))) > 1


class Empty(IterableDataset):
    def __iter__(self):
        return iter(())


def test_a_stream_that_yields_no_batch_names_data_path():
    data = DataLoader(Empty(), batch_size=4, collate_fn=collate_batch)
    data.dataset.set_epoch = lambda epoch: None
    with pytest.raises(ConfigError, match=r"`data.path` is '/data/shards'.*no complete batch"):
        next(resumable_batches(data, Accelerator(cpu=True), 0, "/data/shards"))
