"""The ``data`` and ``validation`` sections' checks (``data/checks.py``): a source without its path (or with one it
would ignore), buckets where they cannot work, what a mixture cannot do, and validation settings that cannot hold
images out are refused, naming the key."""

import pytest

from dit_trainer.errors import ConfigError

from ..conftest import TINY_SHAPES, compose_config, one_paragraph
from .files import BUCKETS, captioned_folder, mixture_overrides


def test_missing_data_path_names_the_folder(tmp_path):
    with pytest.raises(ConfigError, match="metadata.jsonl") as caught:
        compose_config(["+experiment=shapes", "data=imagefolder", f"data.path={tmp_path / 'nope'}"])
    assert "nope" in str(caught.value)


@pytest.mark.parametrize("experiment", ["shapes", "moving_shapes"])
def test_a_path_for_a_source_that_makes_its_own_images_is_refused_not_ignored(experiment):
    with pytest.raises(ConfigError) as caught:
        compose_config([f"+experiment={experiment}", "data.path=/data/my_images"])
    message = one_paragraph(caught.value, "data.path")
    assert f"`data={experiment}` takes no path" in message and "`data=imagefolder data.path=...`" in message


def test_buckets_are_refused_where_they_cannot_work(tmp_path):
    with pytest.raises(ConfigError, match=r"`data\.buckets`.*square images"):
        compose_config([*TINY_SHAPES, BUCKETS])
    with pytest.raises(ConfigError, match=r"`data\.buckets`.*none, pixart"):
        compose_config([*TINY_SHAPES, "data=imagefolder", f"data.path={tmp_path}", "data.buckets=wide"])


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
        compose_config(mixture_overrides(tmp_path, *extra))


def test_two_mixture_entries_of_one_name_are_refused(tmp_path):
    """Their `data/skipped/<name>` counts were one metric, each entry's value overwriting the other's."""
    overrides = mixture_overrides(tmp_path)
    overrides = [item.replace("weight:3}", "weight:3,name:photos}") for item in overrides]
    with pytest.raises(ConfigError) as refused:
        compose_config(overrides)
    message = one_paragraph(refused.value, "data.mixture[1].name")
    assert "is 'photos', but entry 0 is called that too" in message and "`imagefolder1`" in message


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["data.buckets=[[32,32]]", "data.cache_latents=false"], "data.buckets"),
        (["validation.every_n_steps=5", "validation.split=0.1", "data.cache_latents=false"], "validation.split"),
        (["data.cache_latents=true"], "data.cache_latents"),
    ],
)
def test_what_a_mixture_with_a_stream_cannot_do_is_refused_naming_the_key(extra, key):
    """A mixture with a stream is one endless stream of items: no buckets, no held-out split, no encoding once."""
    mixture = "data.mixture=[{source:webdataset,path:'/shards/{0..1}.tar'},{source:shapes}]"
    with pytest.raises(ConfigError, match=rf"`{key}`.*with a stream \(`webdataset`\) among them"):
        compose_config([*TINY_SHAPES, mixture, *extra])


@pytest.mark.parametrize(
    ("overrides", "key", "needle"),
    [
        (["validation.split=0.1", "validation.path=/somewhere"], "validation.split", "exactly one place"),
        (["validation.split=0"], "validation.split", "exactly one place"),
        (["data=webdataset", "data.path='/shards/{0..1}.tar'", "validation.split=0.1"], "validation.split", "streamed"),
        (
            ["data=imagefolder", "data.path=IMAGES", "validation.split=0", "validation.path=/nowhere"],
            "validation.path",
            "metadata.jsonl",
        ),
        (["validation.split=0.1", "validation.timesteps=2000"], "validation.timesteps", "only 1000"),
    ],
)
def test_bad_validation_settings_are_refused_naming_the_key(tmp_path, overrides, key, needle):
    captioned_folder(tmp_path / "images", 2)
    overrides = [item.replace("IMAGES", str(tmp_path / "images")) for item in overrides]
    with pytest.raises(ConfigError) as caught:
        compose_config([*TINY_SHAPES, "validation.every_n_steps=10", *overrides])
    assert caught.value.key == key and needle in str(caught.value)
