"""Dataset mixtures: each epoch draws every source by its weight, seeded and resumable, skipped files are counted
per source, and what a mixture cannot do is refused naming the key."""

import json
from collections import Counter
from itertools import islice

import pytest
from PIL import Image

from dit_trainer.data.batch_plan import BatchPlan
from dit_trainer.data.shapes import write_shapes_folder
from dit_trainer.errors import ConfigError
from dit_trainer.training.batches import resumable_batches
from dit_trainer.training.run import build_trainer

from .conftest import TINY_SHAPES, compose_config


def _photos(folder, count: int, bad: int = 0):
    """``count`` images captioned ``photo <i>`` and ``bad`` truncated files: a second source to mix in."""
    folder.mkdir()
    rows = []
    for i in range(count + bad):
        name = f"{i}.png"
        Image.new("RGB", (40, 32), (i * 5, 90, 200)).save(folder / name)
        if i >= count:
            (folder / name).write_bytes((folder / name).read_bytes()[:40])
        rows.append(json.dumps({"file_name": name, "text": f"photo {i}"}) + "\n")
    (folder / "metadata.jsonl").write_text("".join(rows))
    return folder


def _mixture(tmp_path, *extra: str) -> list[str]:
    shapes = write_shapes_folder(tmp_path / "shapes", 40, [(32, 32)])
    photos = _photos(tmp_path / "photos", 38, bad=2)
    mixture = (
        f"data.mixture=[{{source:imagefolder,path:{shapes},weight:3}},{{source:imagefolder,path:{photos},name:photos}}]"
    )
    return [*TINY_SHAPES, mixture, "data.resolution=32", "data.num_workers=0", "trainer.batch_size=4", *extra]


def test_each_epoch_draws_the_sources_by_weight():
    sources = [0] * 40 + [1] * 40
    plan = BatchPlan([0] * 80, batch_size=4, seed=0, sources=sources, weights=[3.0, 1.0])
    for epoch in range(3):
        plan.set_epoch(epoch)
        drawn = Counter(sources[i] for batch in plan.batches() for i in batch)
        assert drawn == {0: 60, 1: 20}  # source 0's 40 items cycled to its 75 %


def test_a_mixture_trains_by_weight_resumes_exactly_and_counts_skips_per_source(tmp_path):
    trainer = build_trainer(compose_config(_mixture(tmp_path, "data.cache_latents=false")), tmp_path / "run")
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


@pytest.mark.parametrize(
    ("extra", "key", "needle"),
    [
        (["data.path=/somewhere"], "data.path", "their own paths"),
        (["data.cache_dir=/somewhere"], "data.cache_dir", "not supported yet"),
        (["validation.every_n_steps=10", "validation.split=0", "validation.path=/x"], "validation.path", "held out"),
    ],
)
def test_what_a_mixture_cannot_do_is_refused_naming_the_key(tmp_path, extra, key, needle):
    with pytest.raises(ConfigError, match=rf"`{key}`.*with `data\.mixture`, .*{needle}"):
        compose_config(_mixture(tmp_path, *extra))


def test_a_stream_in_a_mixture_is_refused(tmp_path):
    mixture = "data.mixture=[{source:webdataset,path:'/shards/{0..1}.tar'}]"
    with pytest.raises(ConfigError, match=r"`data\.mixture\[0\]\.source`.*a stream"):
        compose_config([*TINY_SHAPES, mixture])
