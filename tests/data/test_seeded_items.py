"""Random augmentation that a resume repeats (``data/seeded_items.py``): a random crop, a flip and one caption of
several are drawn by item and epoch, so a resumed run's fresh DataLoader workers cut every image as the
uninterrupted run's did, while every epoch still draws anew."""

import json
from itertools import islice

import pytest
import torch

from dit_trainer.assemble import build_trainer
from dit_trainer.data.seeded_items import SeededItems
from dit_trainer.data.sources.shapes import write_shapes_folder
from dit_trainer.training.batches import resumable_batches

from ..conftest import compose_config
from .files import BUCKETS, CANVASES, bucketed


def augmented_folder(tmp_path, buckets: bool) -> list[str]:
    """A folder of shapes whose images are wider than their crop, each with two captions, read with a random crop,
    a flip and one of the two captions, by two DataLoader workers."""
    folder = write_shapes_folder(tmp_path / "images", 48, CANVASES if buckets else [(32, 48)])
    rows = [json.loads(line) for line in (folder / "metadata.jsonl").read_text().splitlines()]
    lines = [json.dumps({**row, "alt": row["text"].upper()}) + "\n" for row in rows]
    (folder / "metadata.jsonl").write_text("".join(lines))
    overrides = [option for option in bucketed(folder) if buckets or option != BUCKETS]
    return [*overrides, "data.num_workers=2", "data.crop=random", "data.horizontal_flip=true",
            "data.caption_columns=[text,alt]"]  # fmt: skip


@pytest.mark.parametrize("buckets", [False, True], ids=["squares", "buckets"])
def test_a_resumed_run_reads_each_item_as_drawn_in_the_uninterrupted_one(tmp_path, buckets):
    overrides = augmented_folder(tmp_path, buckets)
    trainer = build_trainer(compose_config(overrides), tmp_path / "whole")
    assert isinstance(trainer.step.dataloader.dataset, SeededItems)
    batches = list(islice(resumable_batches(trainer.step.dataloader, trainer.accelerator, 0), 30))  # 2.5 epochs

    torch.manual_seed(1234)  # a fresh process's generator: what the resumed run's workers are seeded from
    resumed_trainer = build_trainer(compose_config(overrides), tmp_path / "resumed")
    resumed = list(islice(resumable_batches(resumed_trainer.step.dataloader, resumed_trainer.accelerator, 17), 13))
    assert [batch["source_index"] for batch in resumed] == [batch["source_index"] for batch in batches[17:]]
    assert [batch["caption"] for batch in resumed] == [batch["caption"] for batch in batches[17:]]
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(resumed, batches[17:]))

    # Each epoch draws anew: an item is cut or flipped otherwise, or captioned by its other column, in the next.
    first, second = ({} for _ in range(2))
    for epoch, seen in enumerate((first, second)):
        for batch in batches[12 * epoch : 12 * (epoch + 1)]:
            for index, image, caption in zip(batch["source_index"], batch["image"], batch["caption"]):
                seen[index] = (image, caption)
    changed = [i for i in first.keys() & second.keys() if not torch.equal(first[i][0], second[i][0])]
    recaptioned = [i for i in first.keys() & second.keys() if first[i][1] != second[i][1]]
    assert len(changed) > len(first) // 3 and len(recaptioned) > len(first) // 4


class Draws(torch.utils.data.Dataset):
    """Items that are nothing but a draw from torch's generator, as a random crop is."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.rand(3)


def test_a_key_reads_its_item_with_its_rounds_draws_and_leaves_the_readers_generator_alone(monkeypatch):
    items = SeededItems(Draws(), seed=7)
    torch.manual_seed(0)
    first = [items[key] for key in range(10)]  # rounds 0 and 1
    torch.manual_seed(99)
    again = [items[key] for key in reversed(range(10))][::-1]
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # whatever was read before, in whatever order
    assert not any(torch.equal(first[i], first[i + 5]) for i in range(5))  # round 1 draws anew
    torch.manual_seed(0)
    unread = torch.rand(1)
    torch.manual_seed(0)
    items[3]
    assert torch.equal(torch.rand(1), unread)  # the reader's own draws (a training step's noise) go on untouched

    def reseeds_the_gpus(seed: int) -> None:
        raise AssertionError("the GPUs' generators (dropout's) were reseeded by an item's read")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", reseeds_the_gpus)
    items[3]


def test_each_copy_of_an_item_a_mixture_draws_twice_in_an_epoch_is_drawn_anew():
    """A small source weighted up cycles its pool: its items come several times an epoch, each copy cut anew."""
    from collections import Counter

    from dit_trainer.data.batch_plan import BatchPlan, PlanBatchSampler

    plan = BatchPlan([0] * 24, batch_size=4, seed=0, sources=[0] * 4 + [1] * 20, weights=[1, 1])
    items = SeededItems(Draws24(), seed=7)
    for epoch in (0, 1):
        plan.set_epoch(epoch)
        keys = [key for batch in PlanBatchSampler(plan, keyed=True) for key in batch]
        indices = Counter(key % 24 for key in keys)
        assert indices[0] == 3 and len(set(keys)) == len(keys)  # item 0 three times, under three keys
        draws = [items[key] for key in keys if key % 24 == 0]
        assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


class Draws24(Draws):
    def __len__(self) -> int:
        return 24


def test_a_stream_mixed_with_a_randomly_cropped_folder_stays_a_stream(tmp_path):
    """A mixture with a webdataset draws its own crops by sample and epoch: no batch plan, no keys."""
    from dit_trainer.data.stream_loader import StreamLoader

    from ..conftest import TINY_SHAPES
    from .files import captioned_shards, photos_folder

    shards = captioned_shards(tmp_path / "shards", 4, 10, bad=0)
    photos = photos_folder(tmp_path / "photos", 38)
    entries = f"{{source:webdataset,path:'{shards}',caption_column:txt}},{{source:imagefolder,path:{photos}}}"
    overrides = [*TINY_SHAPES, f"data.mixture=[{entries}]", "vae=pixel", "data.resolution=16", "data.num_workers=0",
                 "data.crop=random", "data.cache_latents=false", "trainer.batch_size=4"]  # fmt: skip
    trainer = build_trainer(compose_config(overrides), tmp_path / "run")
    assert isinstance(trainer.step.dataloader, StreamLoader)
    assert len(list(islice(trainer.step.batches(), 3))) == 3
