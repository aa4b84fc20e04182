"""Dataset mixtures (``data/mixture.py``): a mixture trains each source by its weight, seeded and resumable, and
skipped files are counted per source."""

from itertools import islice

import pytest

from dit_trainer.training.batches import resumable_batches
from dit_trainer.training.run import build_trainer

from ..conftest import QUIET, TINY_SHAPES, compose_config, read_metrics
from .files import captioned_shards, mixture_overrides, photos_folder


def test_a_mixture_trains_by_weight_resumes_exactly_and_counts_skips_per_source(tmp_path):
    trainer = build_trainer(compose_config(mixture_overrides(tmp_path, "data.cache_latents=false")), tmp_path / "run")
    batches = list(islice(trainer.batches(), 40))  # two epochs of 20 batches
    captions = [caption for batch in batches for caption in batch["caption"]]
    photos = sum(caption.startswith("photo") for caption in captions)
    assert photos == 40  # a quarter of each epoch's 80 items
    resumed = list(islice(resumable_batches(trainer.dataloader, trainer.accelerator, 23), 17))
    assert [batch["caption"] for batch in resumed] == [batch["caption"] for batch in batches[23:]]
    for batch in batches:
        trainer.bad_files.add(batch)
    counts = trainer.bad_files.check()
    assert counts["data/skipped/photos"] == counts["data/skipped"] > 0
    assert counts["data/skipped/imagefolder0"] == 0


@pytest.mark.slow
def test_a_mixture_with_a_stream_trains_resumes_exactly_and_counts_skips_per_source(tmp_path):
    """A webdataset (weight 1, 3 of each shard's 10 samples truncated) mixed with an image folder (weight 3, 2 of
    its 40 files truncated): every
    process's stream position is checkpointed, and the run resumed at step 3 logs the uninterrupted run's losses."""
    shards = captioned_shards(tmp_path / "shards", 4, 10, bad=3)
    photos = photos_folder(tmp_path / "photos", 38, bad=2)
    stream = f"{{source:webdataset,path:'{shards}',name:shards,caption_column:txt}}"
    entries = f"{stream},{{source:imagefolder,path:{photos},weight:3}}"
    overrides = [*TINY_SHAPES, f"data.mixture=[{entries}]", "vae=pixel", "data.resolution=16", "data.num_workers=0",
                 "data.max_bad_fraction=0.5", "data.cache_latents=false", "trainer.batch_size=4", "trainer.max_steps=6",
                 "trainer.checkpoint_every=3", *QUIET]  # fmt: skip
    build_trainer(compose_config(overrides), tmp_path / "straight").fit()
    checkpoint = tmp_path / "straight" / "checkpoints" / "checkpoint-3"
    assert (checkpoint / "data_stream_0.pt").is_file()
    build_trainer(compose_config([*overrides, f"trainer.resume={checkpoint}"]), tmp_path / "resumed").fit()
    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight[3:]]  # bit for bit
    last = straight[-1]
    assert last["data/skipped"] == last["data/skipped/shards"] + last["data/skipped/imagefolder1"] > 0
