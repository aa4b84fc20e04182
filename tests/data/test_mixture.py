"""Dataset mixtures (``data/mixture.py``): a mixture trains each source by its weight, seeded and resumable, and
skipped files are counted per source; a stream mixture resumed with sources removed, added or reweighted (the change
allowed) continues each kept source where it was and draws by the configured weights."""

import dataclasses
from itertools import islice

import pytest
import torch

from dit_trainer.assemble import build_trainer
from dit_trainer.config import DataConfig, MixtureSource
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.source import build_dataset
from dit_trainer.data.stream_loader import StreamLoader
from dit_trainer.errors import ConfigError
from dit_trainer.training.batches import resumable_batches

from ..conftest import QUIET, TINY_SHAPES, compose_config, read_metrics
from .files import captioned_shards, mixture_overrides, photos_folder


def test_a_mixture_trains_by_weight_resumes_exactly_and_counts_skips_per_source(tmp_path):
    trainer = build_trainer(compose_config(mixture_overrides(tmp_path, "data.cache_latents=false")), tmp_path / "run")
    batches = list(islice(trainer.step.batches(), 40))  # two epochs of 20 batches
    captions = [caption for batch in batches for caption in batch["caption"]]
    photos = sum(caption.startswith("photo") for caption in captions)
    assert photos == 40  # a quarter of each epoch's 80 items
    resumed = list(islice(resumable_batches(trainer.step.dataloader, trainer.accelerator, 23), 17))
    assert [batch["caption"] for batch in resumed] == [batch["caption"] for batch in batches[23:]]
    for batch in batches:
        trainer.step.bad_files.add(batch)
    counts = trainer.step.bad_files.check()
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

    def skipped(records: list[dict]) -> list[dict]:
        return [{key: value for key, value in r.items() if key.startswith("data/skipped")} for r in records]

    assert skipped(resumed) == skipped(straight[3:])  # counted on from the checkpoint's counts, not from 0


def _mixed_loader(*entries: MixtureSource, allow_change: bool = False) -> StreamLoader:
    """A stream mixture of ``entries`` at 8 px, in batches of 4, as ``build_dataloader`` makes it."""
    mixture = build_dataset(DataConfig(mixture=list(entries), resolution=8, shuffle_buffer=4))
    return StreamLoader(mixture, allow_change, batch_size=4, drop_last=True, collate_fn=collate_batch)


def _captions(batches, count: int) -> list[str]:
    return [caption for _ in range(count) for caption in next(batches)["caption"]]


def _saved(loader: StreamLoader, path) -> dict:
    """``loader``'s position, through a file as a checkpoint holds it."""
    torch.save(loader.state_dict(), path)
    return torch.load(path, weights_only=True)


@pytest.fixture
def stream_entries(tmp_path) -> tuple[MixtureSource, MixtureSource]:
    shards = captioned_shards(tmp_path / "shards", 2, 10)
    photos = photos_folder(tmp_path / "photos", 12)
    return (MixtureSource(source="webdataset", path=shards, caption_column="txt", name="shards"),
            MixtureSource(source="imagefolder", path=str(photos), name="photos"))  # fmt: skip


def test_a_stream_mixture_resumed_without_a_source_continues_the_others_where_they_were(stream_entries, tmp_path):
    """Audit F10: the saved sources were rebuilt from the checkpoint, so a removed one was an IndexError."""
    shards, photos = stream_entries
    both = _mixed_loader(shards, photos)
    batches = resumable_batches(both, None, 0)
    _captions(batches, 3)
    state = _saved(both, tmp_path / "position.pt")
    from_shards = [caption for caption in _captions(batches, 6) if caption.startswith("shard")]
    with pytest.raises(ConfigError, match=r"`data.mixture` is \['shards'\], .*other data .*\(photos removed\)"):
        _mixed_loader(shards).load_state_dict(state)
    alone = _mixed_loader(shards, allow_change=True)
    alone.load_state_dict(state)
    assert len(from_shards) >= 8
    assert _captions(resumable_batches(alone, None, 0), 2) == from_shards[:8]  # it goes on at its own position


def test_a_source_added_or_reweighted_at_a_resume_is_drawn_by_its_configured_weight(stream_entries, tmp_path):
    """Audit F10: an added source was never opened and its share went to the last saved one; weights come from
    the config, so a reweighted mixture keeps every source's position and draws by the new weights."""
    shards, photos = stream_entries
    alone = _mixed_loader(shards)
    batches = resumable_batches(alone, None, 0)
    _captions(batches, 2)
    state = _saved(alone, tmp_path / "position.pt")
    after = _captions(batches, 4)
    three_to_one = dataclasses.replace(photos, weight=3.0)
    with pytest.raises(ConfigError, match=r"other data .*\(photos added\)"):
        _mixed_loader(shards, three_to_one).load_state_dict(state)
    added = _mixed_loader(shards, three_to_one, allow_change=True)
    added.load_state_dict(state)
    batches = resumable_batches(added, None, 0)
    captions = _captions(batches, 10)
    from_shards = [caption for caption in captions if caption.startswith("shard")]
    assert 25 <= len(captions) - len(from_shards) <= 35  # 3/4 of 40 items
    assert from_shards == after[: len(from_shards)]  # the kept source goes on at its own position
    state = _saved(added, tmp_path / "position.pt")
    reweighted = _mixed_loader(dataclasses.replace(shards, weight=3.0), photos)  # the same sources: no change
    reweighted.load_state_dict(state)
    photos_drawn = sum(caption.startswith("photo") for caption in _captions(resumable_batches(reweighted, None, 0), 10))
    assert 5 <= photos_drawn <= 15  # 1/4 of 40 items
