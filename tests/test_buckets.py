"""Aspect-ratio buckets: PixArt's table, the nearest-ratio rule, single-bucket seeded batches that shard across
processes and resume exactly, and a mixed-aspect folder trained and sampled at non-square sizes."""

import io
import json
import logging
import tarfile
from itertools import islice

import pytest
import torch
from accelerate.data_loader import BatchSamplerShard
from PIL import Image

from dit_trainer.data.batch_plan import BatchPlan, PlanBatchSampler
from dit_trainer.data.buckets import BucketTable, bucket_table, in_order_batches, pixart_buckets, pixart_tables
from dit_trainer.data.cache import open_cache
from dit_trainer.data.precompute import precompute
from dit_trainer.data.shapes import write_shapes_folder
from dit_trainer.data.transforms import header_size, to_model_input
from dit_trainer.errors import ConfigError
from dit_trainer.training.batches import resumable_batches
from dit_trainer.training.run import build_trainer

from .conftest import TINY_SHAPES, compose_config, run_script, train

SIZES = [(32, 32), (24, 40), (40, 24)]  # (height, width): square, landscape, portrait
BUCKETS = "data.buckets=[[32,32],[24,40],[40,24]]"
CANVASES = [(32, 32), (32, 56), (44, 32)]  # 1:1, 16:9 and 3:4 renders


def _bucketed(folder) -> list[str]:
    """TINY_SHAPES' model on a folder of images, in buckets."""
    return ["data=imagefolder", f"data.path={folder}", "data.resolution=32", "data.num_workers=0", BUCKETS,
            "trainer.batch_size=4"]  # fmt: skip


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


def test_images_are_resized_to_cover_the_bucket_and_cropped():
    image = Image.new("RGB", (160, 90), (255, 0, 0))
    assert to_model_input(image, (24, 40)).shape == (3, 24, 40)
    assert torch.equal(to_model_input(image, 32), to_model_input(image, (32, 32)))


def test_image_sizes_are_read_from_headers_with_exif_rotation():
    buffer = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: decoded upright, the image is 20 wide and 30 high
    Image.new("RGB", (30, 20)).save(buffer, "JPEG", exif=exif)
    assert header_size(buffer.getvalue()) == (20, 30)
    assert header_size(b"not an image") is None


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


def test_in_order_batches_read_every_item_once_one_bucket_per_batch():
    batches = in_order_batches([0, 1, 0, 1, 1, 2], 2)
    assert batches == [[0, 2], [1, 3], [4], [5]]


def test_a_bucketed_folder_gives_single_bucket_batches_and_resumes_exactly(tmp_path, caplog):
    write_shapes_folder(tmp_path / "images", 48, CANVASES)
    with caplog.at_level(logging.INFO):
        trainer = build_trainer(compose_config([*TINY_SHAPES, *_bucketed(tmp_path / "images")]), tmp_path / "run")
    assert "32x32: 16, 24x40: 16, 40x24: 16" in caplog.text
    loader, accelerator = trainer.dataloader, trainer.accelerator
    batches = list(islice(resumable_batches(loader, accelerator, 0), 30))  # 2.5 epochs of 12 batches
    assert {tuple(batch["image"].shape[-2:]) for batch in batches} == set(SIZES)
    assert all(len(batch["image"]) == 4 for batch in batches)
    resumed = list(islice(resumable_batches(loader, accelerator, 17), 13))
    assert [batch["caption"] for batch in resumed] == [batch["caption"] for batch in batches[17:]]
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(resumed, batches[17:]))


def test_buckets_are_refused_where_they_cannot_work(tmp_path):
    with pytest.raises(ConfigError, match=r"`data\.buckets`.*square images"):
        compose_config([*TINY_SHAPES, BUCKETS])
    with pytest.raises(ConfigError, match=r"`data\.buckets`.*none, pixart"):
        compose_config([*TINY_SHAPES, "data=imagefolder", f"data.path={tmp_path}", "data.buckets=wide"])


@pytest.mark.slow
def test_a_mixed_aspect_folder_trains_with_buckets_and_samples_non_square_images(tmp_path):
    write_shapes_folder(tmp_path / "images", 48, CANVASES)
    run = tmp_path / "run"
    train(run, *_bucketed(tmp_path / "images"), "trainer.max_steps=6", "trainer.sample_every=0", "trainer.log_every=2",
          "data.cache_latents=true")  # fmt: skip
    assert (run / "checkpoints").is_dir()
    out = tmp_path / "samples"
    result = run_script(["scripts/sample.py", f"run_dir={run}", "prompts=[a red circle]", "images_per_prompt=2",
                         "height=24", "width=40", f"out_dir={out}", "steps=2"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert [Image.open(out / row["file"]).size for row in rows] == [(40, 24), (40, 24)]
    refused = run_script(["scripts/sample.py", f"run_dir={run}", "prompts=[a red circle]", "height=20",
                          f"out_dir={tmp_path / 'refused'}"])  # fmt: skip
    assert refused.returncode != 0 and "`height`" in refused.stderr and "height=16" in refused.stderr


@pytest.mark.parametrize("source", ["imagefolder", "webdataset"])
def test_a_bucketed_cache_keeps_each_items_bucket(tmp_path, source):
    write_shapes_folder(tmp_path / "images", 48, CANVASES)
    overrides = [*TINY_SHAPES, *_bucketed(tmp_path / "images"), f"data.cache_dir={tmp_path / 'cache'}"]
    if source == "webdataset":  # batches assembled per bucket from the stream, every one written
        overrides += ["data=webdataset", f"data.path={_shards_of(tmp_path / 'images', tmp_path)}"]
    precompute(compose_config(overrides))
    index = json.loads((tmp_path / "cache" / "index.json").read_text())
    assert sorted(tuple(shard["size"]) for shard in index["shards"]) == sorted(SIZES) and index["items"] == 48
    assert index["fingerprint"]["bucket_sizes"] == [list(size) for size in SIZES]
    trainer = build_trainer(compose_config(overrides), tmp_path / "run")
    batches = list(islice(trainer.batches(), 12))
    latent_sizes = {tuple(batch["latent_mean"].shape[-2:]) for batch in batches}
    assert latent_sizes == {(h // 2, w // 2) for h, w in SIZES}  # the shapes VAE halves each side
    with pytest.raises(ConfigError, match=r"data\.cache_dir.*other settings.*bucket_sizes"):
        open_cache(compose_config([*overrides, "data.buckets=[[32,32],[24,40]]"]), torch.device("cpu"))


def _shards_of(folder, root) -> str:
    """The images of an imagefolder as two webdataset shards (png + txt per sample); returns the brace pattern."""
    rows = [json.loads(line) for line in (folder / "metadata.jsonl").read_text().splitlines()]
    for number in range(2):
        with tarfile.open(root / f"{number}.tar", "w") as tar:
            for row in rows[number::2]:
                key = row["file_name"][:-4]
                for name, data in ((f"{key}.png", (folder / row["file_name"]).read_bytes()),
                                   (f"{key}.txt", row["text"].encode())):  # fmt: skip
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return f"'{root}/{{0..1}}.tar'"


def test_a_bucketed_stream_assembles_single_bucket_batches_and_resumes_exactly(tmp_path):
    write_shapes_folder(tmp_path / "images", 48, CANVASES)
    shards = _shards_of(tmp_path / "images", tmp_path)
    overrides = [*TINY_SHAPES, *_bucketed(tmp_path / "images"), "data=webdataset", f"data.path={shards}",
                 "data.shuffle_buffer=8"]  # fmt: skip
    trainer = build_trainer(compose_config(overrides), tmp_path / "run")
    batches = list(islice(trainer.batches(), 25))  # 10 or 11 full batches an epoch: the tails are dropped
    assert {tuple(batch["image"].shape[-2:]) for batch in batches} == set(SIZES)
    assert all(len(batch["caption"]) == 4 for batch in batches)
    resumed = list(islice(resumable_batches(trainer.dataloader, trainer.accelerator, 13), 12))
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(resumed, batches[13:], strict=True))
