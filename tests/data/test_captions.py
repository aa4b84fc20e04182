"""Caption tools (``data/captions.py``): the trigger prefix where the file sources read captions, tag shuffling with
the first tags kept and tag dropout in the training step, drawn from the step's generator without advancing it
(resume exact), and the combinations that cannot work refused in one paragraph."""

import itertools
from dataclasses import replace

import pytest
import torch

from dit_trainer.components.conditioners.class_labels import ClassLabels
from dit_trainer.config import DataConfig
from dit_trainer.data.cache.fingerprint import cache_fingerprint
from dit_trainer.data.captions import TagAugmentation, tag_augmentation
from dit_trainer.data.sources.source import build_dataset
from dit_trainer.diffusion.loss import batch_condition
from dit_trainer.errors import ConfigError

from ..conftest import TINY_SHAPES, class_conditional, compose_config, one_paragraph
from .files import image_folder, png_bytes, write_shards

TAGS = ["a", "b", "c", "d"]
CAPTION = ", ".join(TAGS)


def test_the_prefix_is_the_first_tag_of_every_caption_a_file_source_reads(tmp_path):
    rows = [{"file_name": "1.png", "text": CAPTION}, {"file_name": "2.png", "text": ""}]
    image_folder(tmp_path, rows, {"1.png": png_bytes(), "2.png": png_bytes()})
    data = DataConfig(source="imagefolder", path=str(tmp_path), resolution=8, caption_prefix="sks")
    assert [build_dataset(data)[i]["caption"] for i in range(2)] == [f"sks, {CAPTION}", "sks"]
    (tmp_path / "shards").mkdir()
    shards = write_shards(tmp_path / "shards", [[{"__key__": "1", "png": png_bytes(), "txt": CAPTION}]])
    streamed = build_dataset(replace(data, source="webdataset", path=shards, caption_column="txt"))
    assert [item["caption"] for item in streamed] == [f"sks, {CAPTION}"]


def orders(augmentation: TagAugmentation, caption: str, seeds: range) -> list[str]:
    return [augmentation([caption], torch.Generator().manual_seed(seed))[0] for seed in seeds]


def test_shuffling_keeps_the_prefix_and_the_first_tags_in_place_and_reaches_every_order():
    seen = orders(TagAugmentation("sks", shuffle=True, keep=1), f"sks, {CAPTION}", range(200))
    assert all(caption.startswith("sks, a, ") for caption in seen)
    assert {tuple(caption.split(", ")[2:]) for caption in seen} == set(itertools.permutations("bcd"))


def test_tag_dropout_drops_tags_after_the_kept_ones_at_its_rate():
    seen = orders(TagAugmentation(keep=1, dropout=0.25), CAPTION, range(2000))
    assert all(caption.startswith("a") for caption in seen)
    kept = sum(len(caption.split(", ")) - 1 for caption in seen) / (3 * len(seen))
    assert 0.72 < kept < 0.78


def test_the_draws_follow_the_generator_state_and_leave_it_unchanged():
    """A resumed run restores the step's generator, so it draws the same tags; the noise drawn after is the same with
    the tools on or off, since the generator is read, not advanced."""
    augmentation = TagAugmentation(shuffle=True, dropout=0.2)
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    first = augmentation([CAPTION] * 8, generator)
    assert torch.equal(generator.get_state(), state)
    restored = torch.Generator()
    restored.set_state(state)
    assert augmentation([CAPTION] * 8, restored) == first
    torch.randn(1, generator=generator)  # the next step's generator state draws other tags
    assert augmentation([CAPTION] * 8, generator) != first


def test_the_step_encodes_the_augmented_captions():
    """Class labels make the encoded caption visible: every order of the tags is a class."""
    names = [", ".join(order) for order in itertools.permutations(TAGS)]
    labels = ClassLabels(names, torch.device("cpu"))
    batch = {"caption": [CAPTION] * 64}
    tags = tag_augmentation(DataConfig(shuffle_tags=True, keep_tags=2))
    encoded = batch_condition(batch, labels, 0.0, torch.Generator().manual_seed(0), tags)
    assert {names[i] for i in encoded.sequence.tolist()} == {"a, b, c, d", "a, b, d, c"}
    plain = batch_condition(batch, labels, 0.0, torch.Generator().manual_seed(0))
    assert set(plain.sequence.tolist()) == {names.index(CAPTION)}
    assert tag_augmentation(DataConfig(caption_prefix="sks", keep_tags=2)) is None  # nothing drawn: untouched


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["data.shuffle_tags=true", "data.cache_dir=/tmp/cache"], "data.shuffle_tags", "frozen for the whole run"),
        (["data.tag_dropout=0.1", "data.cache_dir=/tmp/cache"], "data.tag_dropout", "data.cache_latents=true"),
        (["data.caption_prefix=sks"], "data.caption_prefix", "`shapes` makes its own captions"),
    ],
)
def test_combinations_that_cannot_work_are_refused(overrides, key, says):
    with pytest.raises(ConfigError) as refused:
        compose_config([*TINY_SHAPES, *overrides])
    assert says in one_paragraph(refused.value, key)


def test_a_class_conditional_run_refuses_caption_tools(tmp_path):
    """Its captions are class names, looked up by name."""
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "1.png").write_bytes(png_bytes(size=(16, 16)))
    with pytest.raises(ConfigError) as refused:
        compose_config(
            [*TINY_SHAPES, *class_conditional(tmp_path, "trainer.sample_prompts=[cat]"), "data.caption_prefix=sks"]
        )
    assert "looks every caption up as a class name" in one_paragraph(refused.value, "data.caption_prefix")


def test_a_cache_fingerprint_counts_the_prefix_only_when_set():
    """Caches written before the prefix existed still match; one made with a prefix does not match one without."""
    cfg = compose_config(TINY_SHAPES)
    read = cache_fingerprint(cfg.data, cfg.vae, cfg.conditioner, None)["data"]
    assert "caption_prefix" not in read and "shuffle_tags" not in read
    prefixed = cache_fingerprint(replace(cfg.data, caption_prefix="sks"), cfg.vae, cfg.conditioner, None)["data"]
    assert prefixed["caption_prefix"] == "sks"
