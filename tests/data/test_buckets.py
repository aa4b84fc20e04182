"""Aspect-ratio buckets (``data/buckets.py``): PixArt's table, the nearest-ratio rule, in-order batches, bucket sizes
that wait for a VAE's config, and bucketed folders, caches and streams whose batches are single-bucket and resume
exactly."""

import json
import logging
from itertools import islice

import pytest
import torch

from dit_trainer.assemble import build_trainer
from dit_trainer.components.geometry import configured_buckets
from dit_trainer.data.buckets import (
    BucketTable,
    bucket_table,
    in_order_batches,
    pixart_buckets,
    pixart_tables,
)
from dit_trainer.data.sources.shapes import write_shapes_folder
from dit_trainer.errors import ConfigError, ModelLoadError
from dit_trainer.training.batches import resumable_batches

from ..conftest import TINY_SHAPES, compose_config, open_cache_of, precompute_cache
from .files import CANVASES, SIZES, bucketed, shards_of


@pytest.mark.parametrize("resolution", [256, 512, 1024])
def test_the_pixart_preset_is_the_published_table_at_its_resolutions(resolution):
    assert pixart_buckets(resolution, 16) == list(dict.fromkeys(pixart_tables()[resolution]))


def test_the_pixart_preset_scales_to_any_resolution_in_whole_patches():
    sizes = pixart_buckets(32, 8)
    assert (32, 32) in sizes and len(sizes) > 3
    assert all(h % 8 == 0 and w % 8 == 0 for h, w in sizes)
    assert min(h / w for h, w in sizes) < 0.5 < 2 < max(h / w for h, w in sizes)  # wide and tall buckets remain


def test_each_image_goes_to_the_bucket_nearest_its_aspect_ratio():
    table = BucketTable(tuple(SIZES))
    assert [table.nearest(w, h) for w, h in [(100, 100), (1920, 1080), (300, 400), (90, 110)]] == [0, 1, 2, 0]
    assert table.assign([None, (40, 24)]) == [0, 1]  # an unreadable header: the squarest bucket


def test_a_bucket_the_patches_do_not_divide_is_refused_naming_the_fix():
    with pytest.raises(ConfigError, match=r"data\.buckets.*24x30.*multiple of 8.*\[24, 32\]"):
        bucket_table([[32, 32], [24, 30]], 32, 8)


def test_in_order_batches_read_every_item_once_one_bucket_per_batch():
    batches = in_order_batches([0, 1, 0, 1, 1, 2], 2)
    assert batches == [[0, 2], [1, 3], [4], [5]]


def test_listed_sizes_off_the_patch_grid_are_refused_with_the_config_after_the_data_checks(tmp_path):
    """Where the models' config files are on this machine the sizes are checked when the config is read, not when
    the data is; and after the data's own checks, so that a source of squares is told so first."""
    write_shapes_folder(tmp_path / "images", 8, CANVASES)
    folder = [*TINY_SHAPES, *bucketed(tmp_path / "images")]
    with pytest.raises(ConfigError, match=r"data\.buckets.*the bucket 30x30 is not a multiple.*\[32, 32\]"):
        compose_config([*folder, "data.buckets=[[30,30]]"])
    with pytest.raises(ConfigError, match=r"`shapes` gives square images of one size"):
        compose_config([*TINY_SHAPES, "data.buckets=[[30,30]]"])


def test_bucket_sizes_wait_for_the_config_files_of_models_not_on_this_machine(tmp_path, online, monkeypatch):
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    cfg = compose_config(["+experiment=dit", f"data.path={tmp_path}"])  # accepted: the VAE is only a hub id here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # so its config.json, downloaded when the data is read, cannot come
    with pytest.raises(ModelLoadError, match=r"`vae\.pretrained=stabilityai/sd-vae-ft-ema`"):
        configured_buckets(cfg.model, cfg.vae, cfg.data)


def test_a_bucketed_folder_gives_single_bucket_batches_and_resumes_exactly(tmp_path, caplog):
    write_shapes_folder(tmp_path / "images", 48, CANVASES)
    with caplog.at_level(logging.INFO):
        trainer = build_trainer(compose_config([*TINY_SHAPES, *bucketed(tmp_path / "images")]), tmp_path / "run")
    assert "32x32: 16, 24x40: 16, 40x24: 16" in caplog.text
    assert len(list((tmp_path / "run" / "image_sizes").glob("*.json"))) == 1  # the sizes index: the run's own
    loader, accelerator = trainer.step.dataloader, trainer.accelerator
    batches = list(islice(resumable_batches(loader, accelerator, 0), 30))  # 2.5 epochs of 12 batches
    assert {tuple(batch["image"].shape[-2:]) for batch in batches} == set(SIZES)
    assert all(len(batch["image"]) == 4 for batch in batches)
    resumed = list(islice(resumable_batches(loader, accelerator, 17), 13))
    assert [batch["caption"] for batch in resumed] == [batch["caption"] for batch in batches[17:]]
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(resumed, batches[17:]))


@pytest.mark.parametrize("source", ["imagefolder", "webdataset"])
def test_a_bucketed_cache_keeps_each_items_bucket(tmp_path, source):
    write_shapes_folder(tmp_path / "images", 48, CANVASES)
    overrides = [*TINY_SHAPES, *bucketed(tmp_path / "images"), f"data.cache_dir={tmp_path / 'cache'}"]
    if source == "webdataset":  # batches assembled per bucket from the stream, every one written
        overrides += ["data=webdataset", f"data.path={shards_of(tmp_path / 'images', tmp_path)}"]
    precompute_cache(compose_config(overrides))
    sizes_indexes = list((tmp_path / "cache" / "image_sizes").glob("*.json"))
    assert len(sizes_indexes) == (source == "imagefolder")  # in the cache it served (a stream needs none)
    index = json.loads((tmp_path / "cache" / "index.json").read_text())
    assert sorted(tuple(shard["size"]) for shard in index["shards"]) == sorted(SIZES) and index["items"] == 48
    assert index["fingerprint"]["bucket_sizes"] == [list(size) for size in SIZES]
    trainer = build_trainer(compose_config(overrides), tmp_path / "run")
    assert not (tmp_path / "run" / "image_sizes").exists()  # training from the cache reads no sizes
    batches = list(islice(trainer.step.batches(), 12))
    latent_sizes = {tuple(batch["latent_mean"].shape[-2:]) for batch in batches}
    assert latent_sizes == {(h // 2, w // 2) for h, w in SIZES}  # the shapes VAE halves each side
    with pytest.raises(ConfigError, match=r"data\.cache_dir.*other settings.*bucket_sizes"):
        cfg = compose_config([*overrides, "data.buckets=[[32,32],[24,40]]"])
        open_cache_of(cfg)


def test_a_bucketed_stream_assembles_single_bucket_batches_and_resumes_exactly(tmp_path):
    write_shapes_folder(tmp_path / "images", 48, CANVASES)
    shards = shards_of(tmp_path / "images", tmp_path)
    overrides = [*TINY_SHAPES, *bucketed(tmp_path / "images"), "data=webdataset", f"data.path={shards}",
                 "data.shuffle_buffer=8"]  # fmt: skip
    trainer = build_trainer(compose_config(overrides), tmp_path / "run")
    batches = list(islice(trainer.step.batches(), 25))  # 10 or 11 full batches an epoch: the tails are dropped
    assert {tuple(batch["image"].shape[-2:]) for batch in batches} == set(SIZES)
    assert all(len(batch["caption"]) == 4 for batch in batches)
    resumed = list(islice(resumable_batches(trainer.step.dataloader, trainer.accelerator, 13), 12))
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(resumed, batches[13:], strict=True))
