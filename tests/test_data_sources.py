"""The file-based data sources (imagefolder, hf, webdataset) on small data sets written here, unreadable files
included, and the transforms and collate function they share."""

import hashlib
import io
import json
import logging
import re
import tarfile

import datasets
import numpy as np
import pytest
import torch
import webdataset
from PIL import Image
from torch.utils.data import DataLoader

from dit_trainer.config import DataConfig
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.hf import HFImageDataset
from dit_trainer.data.imagefolder import ImageFolderDataset
from dit_trainer.data.shapes import ShapesDataset
from dit_trainer.data.source import build_dataset
from dit_trainer.data.transforms import resize_to_cover, to_model_input, to_tensor
from dit_trainer.data.webdataset import WebDatasetSource
from dit_trainer.errors import ConfigError

from .conftest import TINY_SHAPES, run_script, train


def _png(color=(255, 0, 0), size=(24, 16)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


def _noise(size=(48, 32), seed=0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _noise_png(seed=0) -> bytes:
    buffer = io.BytesIO()
    _noise(seed=seed).save(buffer, "PNG")
    return buffer.getvalue()


# Each kind of unreadable image: name -> bytes (None: the file does not exist).
CORRUPT = {
    "truncated.png": _noise_png()[:300],
    "empty.png": b"",
    "text.jpg": b"this is a caption file renamed to .jpg\n",
    "missing.png": None,
}


def _assert_in_range(image: torch.Tensor, resolution: int) -> None:
    assert image.shape == (3, resolution, resolution) and image.dtype == torch.float32
    assert image.min() >= -1 and image.max() <= 1


def _assert_all_corrupt_reported(bad_files: list[str]) -> None:
    for name in CORRUPT:
        assert any(name in record for record in bad_files), (name, bad_files)
    assert any("file not found" in record for record in bad_files)
    assert any("ValueError: empty file (0 bytes)" in record for record in bad_files)


# --- transforms and collate ---------------------------------------------------------------------------------------


def test_center_crop_keeps_the_middle_and_none_squashes_the_whole_image():
    bands = Image.new("RGB", (90, 20))  # red | green | blue, 30 pixels each: the centre square is all green
    for index, color in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        bands.paste(color, (30 * index, 0, 30 * index + 30, 20))
    center = to_model_input(bands, 12, crop="center")
    assert torch.allclose(center, torch.tensor([-1.0, 1.0, -1.0]).view(3, 1, 1).expand(3, 12, 12), atol=0.05)
    squashed = to_model_input(bands, 12, crop="none")
    assert squashed[0, :, 0].min() > 0.9 and squashed[2, :, -1].min() > 0.9  # red left edge, blue right edge
    with pytest.raises(ValueError, match="crop"):
        to_model_input(bands, 12, crop="middle")


def test_random_crop_and_flip_are_windows_of_the_image_and_repeat_for_a_generator():
    image = _noise()
    resized = to_tensor(resize_to_cover(image, 16, 16))  # (3, 16, 24): the random crop is a window of this
    windows = [resized[:, :, left : left + 16] for left in range(resized.shape[-1] - 16 + 1)]

    def crop(seed: int, **kwargs) -> torch.Tensor:
        return to_model_input(image, 16, generator=torch.Generator().manual_seed(seed), **kwargs)

    crops = [crop(seed, crop="random") for seed in range(12)]
    assert all(any(torch.equal(c, window) for window in windows) for c in crops)
    assert len({tuple(c.flatten()[:50].tolist()) for c in crops}) > 2  # several offsets are drawn
    assert all(torch.equal(crop(seed, crop="random"), crops[seed]) for seed in range(12))

    center = to_model_input(image, 16)
    flips = [crop(seed, horizontal_flip=True) for seed in range(12)]
    assert all(torch.equal(f, center) or torch.equal(f, center.flip(-1)) for f in flips)
    assert any(torch.equal(f, center) for f in flips) and any(torch.equal(f, center.flip(-1)) for f in flips)
    assert all(torch.equal(crop(seed, horizontal_flip=True), flips[seed]) for seed in range(12))


def test_collate_batch_stacks_images_and_gathers_bad_files():
    items = [
        {"image": torch.zeros(3, 8, 8), "caption": "a"},
        {"image": torch.ones(3, 8, 8), "caption": "b", "bad_files": ["x.png: empty file", "y.png: file not found"]},
        {"image": torch.ones(3, 8, 8), "caption": "c", "bad_files": ["z.png: truncated"]},
    ]
    batch = collate_batch(items)
    assert batch["image"].shape == (3, 3, 8, 8) and batch["caption"] == ["a", "b", "c"]
    assert batch["bad_files"] == ["x.png: empty file", "y.png: file not found", "z.png: truncated"]
    assert collate_batch(items[:1])["bad_files"] == []
    shapes = next(iter(DataLoader(ShapesDataset(length=4, resolution=8), batch_size=4, collate_fn=collate_batch)))
    assert shapes["image"].shape == (4, 3, 8, 8) and shapes["bad_files"] == []


# --- imagefolder --------------------------------------------------------------------------------------------------


def _image_folder(root, rows, files):
    for name, data in files.items():
        if data is not None:
            (root / name).write_bytes(data)
    (root / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def test_imagefolder_skips_unreadable_files_and_reports_them_in_the_batch(tmp_path):
    names = ["good0.png", *CORRUPT, "good1.png"]
    files = {"good0.png": _png((255, 0, 0)), **CORRUPT, "good1.png": _png((0, 0, 255))}
    _image_folder(tmp_path, [{"file_name": n, "text": n} for n in names], files)
    dataset = ImageFolderDataset(tmp_path, resolution=16)
    batch = next(iter(DataLoader(dataset, batch_size=len(names), collate_fn=collate_batch, num_workers=0)))
    # Items 1-4 are unreadable: each is replaced by the next readable file, good1.png.
    assert batch["caption"] == ["good0.png"] + ["good1.png"] * 5
    assert batch["image"].shape == (6, 3, 16, 16)
    _assert_all_corrupt_reported(batch["bad_files"])
    assert "bad_files" not in dataset[0]
    assert dataset[1]["bad_files"] == [
        "truncated.png: OSError: image file is truncated",
        "empty.png: ValueError: empty file (0 bytes)",
        "text.jpg: not an image PIL can read",
        "missing.png: file not found",
    ]


def test_imagefolder_gives_up_after_100_unreadable_files_in_a_row(tmp_path):
    files = {f"{i:03d}.png": b"" for i in range(120)} | {"good.png": _png()}
    _image_folder(tmp_path, [{"file_name": n, "text": "x"} for n in files], files)
    dataset = ImageFolderDataset(tmp_path, resolution=8)
    assert len(dataset[30]["bad_files"]) == 90  # 030..119, then good.png
    with pytest.raises(ConfigError, match=r"data.path.*every one of the last 100 files was unreadable"):
        dataset[0]


def test_imagefolder_caption_columns_draw_among_columns(tmp_path):
    _image_folder(tmp_path, [{"file_name": "a.png", "short": "red", "long": "a red square"}], {"a.png": _png()})
    dataset = ImageFolderDataset(tmp_path, resolution=8, caption_columns=["short", "long"])
    torch.manual_seed(0)
    assert {dataset[0]["caption"] for _ in range(40)} == {"red", "a red square"}
    with pytest.raises(ConfigError, match="data.caption_columns"):
        ImageFolderDataset(tmp_path, resolution=8, caption_columns=["short", "medium"])


# --- hf -----------------------------------------------------------------------------------------------------------

HF_FEATURES = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})


def test_hf_saved_dataset_yields_images_and_reports_unreadable_rows(tmp_path):
    corrupt = {name: data for name, data in CORRUPT.items() if data is not None}  # save_to_disk embeds files
    images = [{"bytes": _png((40 * i, 0, 0)), "path": None} for i in range(3)]
    images += [{"bytes": data, "path": name} for name, data in corrupt.items()]
    rows = {"image": images, "text": [f"good {i}" for i in range(3)] + list(corrupt)}
    datasets.Dataset.from_dict(rows, features=HF_FEATURES).save_to_disk(tmp_path / "saved")
    dataset = HFImageDataset(str(tmp_path / "saved"), resolution=16)
    assert len(dataset) == 6
    batch = next(iter(DataLoader(dataset, batch_size=6, collate_fn=collate_batch, num_workers=0)))
    for image in batch["image"]:
        _assert_in_range(image, 16)
    # Rows 3-5 are unreadable: the search wraps around to row 0.
    assert batch["caption"] == ["good 0", "good 1", "good 2"] + ["good 0"] * 3
    assert batch["image"][1, 0].mean() > batch["image"][0, 0].mean()  # row 1 is redder than row 0
    assert batch["bad_files"] == [
        "row 3 (truncated.png): OSError: image file is truncated",
        "row 4 (empty.png): ValueError: empty file (0 bytes)",
        "row 5 (text.jpg): not an image PIL can read",
        "row 4 (empty.png): ValueError: empty file (0 bytes)",
        "row 5 (text.jpg): not an image PIL can read",
        "row 5 (text.jpg): not an image PIL can read",
    ]


def test_hf_dataset_dict_split_and_caption_columns(tmp_path):
    rows = {"image": [{"bytes": _png(), "path": None}] * 2, "short": ["red", "red"], "long": ["a red box"] * 2}
    train = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
    datasets.DatasetDict({"train": train, "test": train.select([0])}).save_to_disk(tmp_path / "dict")
    dataset = HFImageDataset(str(tmp_path / "dict"), 8, split="test", caption_columns=["short", "long"])
    assert len(dataset) == 1
    torch.manual_seed(0)
    assert {dataset[0]["caption"] for _ in range(40)} == {"red", "a red box"}
    with pytest.raises(ConfigError, match=r"data.split.*\['test', 'train'\]"):
        HFImageDataset(str(tmp_path / "dict"), 8, split="validation")


def test_hf_local_data_folder_loads_with_load_dataset(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # keep ~/.cache clean
    folder = tmp_path / "folder"
    folder.mkdir()
    rows = [{"file_name": f"{i}.png", "text": f"caption {i}"} for i in range(3)]
    _image_folder(folder, rows, {f"{i}.png": _png() for i in range(3)})
    dataset = HFImageDataset(str(folder), resolution=8)
    assert sorted(item["caption"] for item in dataset) == ["caption 0", "caption 1", "caption 2"]
    _assert_in_range(dataset[0]["image"], 8)
    (folder / "1.png").unlink()  # rows refer to the files by path: a file deleted since is skipped
    assert [item.get("bad_files") for item in dataset] == [None, [f"row 1 ({folder / '1.png'}): file not found"], None]


def test_hf_bad_path_and_columns_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"`data.path` is 'no-such-user/no-such-data'.*HF_HUB_OFFLINE"):
        HFImageDataset("no-such-user/no-such-data", 8)
    with pytest.raises(ConfigError, match="data.path"):
        HFImageDataset(str(tmp_path / "nothing here"), 8)
    rows = {"img": [{"bytes": _png(), "path": None}], "caption": ["x"], "label": [3]}
    datasets.Dataset.from_dict(rows).cast_column("img", datasets.Image()).save_to_disk(tmp_path / "saved")
    path = str(tmp_path / "saved")
    with pytest.raises(ConfigError, match=r"data.image_column.*img, caption, label"):
        HFImageDataset(path, 8, caption_column="caption")
    with pytest.raises(ConfigError, match=r"data.caption_column.*img, caption, label"):
        HFImageDataset(path, 8, image_column="img")
    with pytest.raises(ConfigError, match="data.image_column.*not images"):
        HFImageDataset(path, 8, image_column="label", caption_column="caption")
    assert HFImageDataset(path, 8, image_column="img", caption_column="caption")[0]["caption"] == "x"


# --- webdataset ---------------------------------------------------------------------------------------------------


def _write_shards(folder, samples_per_shard: list[list[dict]]) -> str:
    """Shards 000000.tar, ... written with webdataset's own TarWriter; returns the brace pattern."""
    for index, samples in enumerate(samples_per_shard):
        with webdataset.TarWriter(str(folder / f"{index:06d}.tar")) as writer:
            for sample in samples:
                writer.write(sample)
    return str(folder / f"{{000000..{len(samples_per_shard) - 1:06d}}}.tar")


def _captions(dataset, num_workers: int) -> list[str]:
    loader = DataLoader(dataset, batch_size=2, collate_fn=collate_batch, num_workers=num_workers)
    return [caption for batch in loader for caption in batch["caption"]]


@pytest.mark.parametrize("shuffle_buffer", [0, 4])
def test_webdataset_shards_split_over_ranks_and_workers_cover_every_sample_once(tmp_path, shuffle_buffer):
    png = _png()
    shards = [[{"__key__": f"s{s}_{i}", "png": png, "txt": f"s{s}_{i}"} for i in range(3)] for s in range(8)]
    pattern = _write_shards(tmp_path, shards)
    everything = sorted(sample["txt"] for shard in shards for sample in shard)
    ranks = [WebDatasetSource(pattern, 8, rank=rank, world_size=2, shuffle_buffer=shuffle_buffer) for rank in range(2)]
    orders = []
    for epoch in range(2):
        seen = []
        for dataset in ranks:
            dataset.set_epoch(epoch)
            seen.extend(_captions(dataset, num_workers=2))
        assert sorted(seen) == everything  # every sample exactly once per epoch
        orders.append(seen)
    assert orders[0] != orders[1]  # the same set in another order
    assert [c for dataset in ranks for c in _captions(dataset, num_workers=2)] == orders[1]  # and repeatable


def test_webdataset_shuffle_buffer_reorders_samples_within_a_shard(tmp_path):
    samples = [{"__key__": f"k{i:02d}", "png": _png(), "txt": f"k{i:02d}"} for i in range(12)]
    pattern = _write_shards(tmp_path, [samples])
    in_tar_order = [s["txt"] for s in samples]
    assert _captions(WebDatasetSource(pattern, 8), num_workers=0) == in_tar_order
    shuffled = WebDatasetSource(pattern, 8, shuffle_buffer=4)
    first = _captions(shuffled, num_workers=0)
    assert first != in_tar_order and sorted(first) == in_tar_order
    assert _captions(shuffled, num_workers=0) == first  # seeded: a resumed run reads the same order
    shuffled.set_epoch(1)
    assert _captions(shuffled, num_workers=0) != first


def test_webdataset_skips_corrupt_samples_and_truncated_shards(tmp_path):
    good = [{"__key__": f"good{i}", "png": _noise_png(i), "txt": f"good {i}"} for i in range(3)]
    corrupt = [
        {"__key__": name.split(".")[0], name.split(".")[1]: data, "txt": name}
        for name, data in CORRUPT.items()
        if data is not None
    ]
    no_image = [{"__key__": "missing", "txt": "a sample whose image file is missing"}]
    pattern = _write_shards(tmp_path, [good[:1] + corrupt + good[1:2], no_image + good[2:]])
    whole = (tmp_path / "000001.tar").read_bytes()
    (tmp_path / "000001.tar").write_bytes(whole[: len(whole) // 2])  # cut inside good2's image
    dataset = WebDatasetSource(pattern, 16, seed=0)
    dataset.set_epoch(0)
    batches = list(DataLoader(dataset, batch_size=8, collate_fn=collate_batch, num_workers=0))
    assert len(batches) == 1
    batch = batches[0]
    assert sorted(batch["caption"]) == ["good 0", "good 1"]
    for image in batch["image"]:
        _assert_in_range(image, 16)
    bad = batch["bad_files"]
    assert len(bad) == 5, bad
    assert any("000000.tar:truncated: OSError" in record for record in bad)
    assert any("000000.tar:empty: ValueError: empty file" in record for record in bad)
    assert any("000000.tar:text: not an image" in record for record in bad)
    assert any("000001.tar:missing: ValueError: no image member (it has txt)" in record for record in bad)
    assert any("000001.tar:good2: ReadError" in record for record in bad)


def test_webdataset_json_captions_and_caption_columns(tmp_path):
    samples = [{"__key__": f"k{i}", "jpg": _png(), "json": {"short": "red", "long": "a red box"}} for i in range(2)]
    pattern = _write_shards(tmp_path, [samples])
    torch.manual_seed(0)
    dataset = WebDatasetSource(pattern, 8, caption_columns=["short", "long"], crop="random", horizontal_flip=True)
    captions = {item["caption"] for _ in range(20) for item in dataset}
    assert captions == {"red", "a red box"}
    assert next(iter(WebDatasetSource(pattern, 8, caption_column="long")))["caption"] == "a red box"
    with pytest.raises(ConfigError, match=r"data.caption_column.*\['long', 'short'\]"):
        WebDatasetSource(pattern, 8, caption_column="txt")


def test_webdataset_bad_paths_name_data_path_and_few_shards_warn(tmp_path, caplog):
    pattern = _write_shards(tmp_path, [[{"__key__": "a", "png": _png(), "txt": "a"}]] * 2)
    with pytest.raises(ConfigError, match=r"data.path.*2 of its 4 shards do not exist"):
        WebDatasetSource(pattern.replace("000001", "000003"), 8)
    with pytest.raises(ConfigError, match=r"data.path.*names no shards"):
        WebDatasetSource("", 8)
    (tmp_path / "broken.tar").write_bytes(b"not a tar archive" * 100)
    with_broken = WebDatasetSource(f"{{{pattern},{tmp_path}/broken.tar}}", 8)
    batch = next(iter(DataLoader(with_broken, batch_size=2, collate_fn=collate_batch)))
    assert batch["caption"] == ["a", "a"] and batch["bad_files"] == [
        f"{tmp_path}/broken.tar: ReadError: invalid header"
    ]
    with caplog.at_level(logging.WARNING):
        assert [item["caption"] for item in WebDatasetSource(pattern, 8, rank=2, world_size=3)] == []
    assert "2 shards for 3 ranks x 1 workers" in caplog.text


def test_build_dataset_dispatches_on_source(tmp_path):
    _image_folder(tmp_path, [{"file_name": "a.png", "text": "a"}], {"a.png": _png()})
    pattern = _write_shards(tmp_path, [[{"__key__": "a", "png": _png(), "txt": "a"}]])
    datasets.Dataset.from_dict({"image": [{"bytes": _png(), "path": None}], "text": ["a"]}).cast_column(
        "image", datasets.Image()
    ).save_to_disk(tmp_path / "hf")
    expected = {
        "shapes": (ShapesDataset, None),
        "imagefolder": (ImageFolderDataset, str(tmp_path)),
        "hf": (HFImageDataset, str(tmp_path / "hf")),
        "webdataset": (WebDatasetSource, pattern),
    }
    for source, (kind, path) in expected.items():
        caption = "txt" if source == "webdataset" else "text"
        dataset = build_dataset(DataConfig(source=source, path=path, resolution=8, caption_column=caption))
        assert isinstance(dataset, kind)
        item = next(iter(dataset))
        _assert_in_range(item["image"], 8)


def test_tar_written_with_tarfile_reads_too(tmp_path):
    """Shards from other writers (plain tar, folders inside, upper-case extensions) follow the same convention."""
    with tarfile.open(tmp_path / "plain.tar", "w") as tar:
        for name, data in [("dir/x.JPG", _png()), ("dir/x.txt", b"in a folder")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert [item["caption"] for item in WebDatasetSource(str(tmp_path / "plain.tar"), 8)] == ["in a folder"]


# --- each source through train.py --------------------------------------------------------------------------------

TRAIN_SMALL = ["vae=pixel", "data.resolution=16", "data.num_workers=0", "trainer.batch_size=4", "trainer.max_steps=5",
               "trainer.log_every=1", "trainer.sample_every=0", "trainer.ema_decay=0"]  # fmt: skip


def _training_data(root, source: str, good: int = 11, bad: int = 1) -> str:
    """``good`` readable images and ``bad`` truncated PNGs in the format of ``source``; returns data.path."""
    files = {f"{i:02d}.png": _png((20 * i, 100, 200 - 10 * i)) for i in range(good)}
    files |= {f"bad{i}.png": _noise_png(i)[:300] for i in range(bad)}
    if source == "imagefolder":
        return str(_image_folder(root, [{"file_name": n, "text": f"picture {n}"} for n in files], files))
    if source == "hf":
        rows = {"image": [{"bytes": data, "path": name} for name, data in files.items()],
                "text": [f"picture {n}" for n in files]}  # fmt: skip
        datasets.Dataset.from_dict(rows, features=HF_FEATURES).save_to_disk(root / "saved")
        return str(root / "saved")
    samples = [{"__key__": name[:-4], "png": data, "txt": f"picture {name}"} for name, data in files.items()]
    return "'" + _write_shards(root, [samples[::2], samples[1::2]]) + "'"  # quoted: Hydra would parse the braces


@pytest.mark.slow
@pytest.mark.parametrize("source", ["imagefolder", "hf", "webdataset"])
def test_each_source_feeds_a_training_run_and_counts_skipped_files(tmp_path, source):
    path = _training_data(tmp_path, source)
    run_dir = tmp_path / "run"
    train(run_dir, f"data={source}", f"data.path={path}", *TRAIN_SMALL)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert 1 <= records[-1]["data/skipped"] <= 2  # 20 images read from 12 files: the bad one once or twice


@pytest.mark.slow
def test_a_mostly_unreadable_data_set_stops_the_run_naming_the_files(tmp_path):
    path = _training_data(tmp_path, "imagefolder", good=6, bad=6)
    result = run_script(["train.py", *TINY_SHAPES, f"hydra.run.dir={tmp_path / 'run'}", "data=imagefolder",
                         f"data.path={path}", *TRAIN_SMALL, "data.max_bad_fraction=0.2"], timeout=240)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "were unreadable and skipped, more than `data.max_bad_fraction=0.2`" in result.stderr
    assert re.search(r"the first: bad\d.png: OSError: image file is truncated; bad\d.png", result.stderr)


# --- bounded memory, decompression bombs, transform failures, captions (issue 17) ---------------------------------


def _bands(size, middle=(0, 255, 0), ends=(255, 0, 0)) -> Image.Image:
    """``ends`` colour, with a square of ``middle`` colour at the centre of the long side."""
    image = Image.new("RGB", size, ends)
    short = min(size)
    offset = (max(size) - short) // 2
    box = (offset, 0, offset + short, short) if size[0] >= size[1] else (0, offset, short, offset + short)
    image.paste(middle, box)
    return image


def test_transforms_of_usual_images_are_bit_identical_to_before():
    """Aspect ratios up to 12:1 through every crop, against the outputs of the code before issue 17."""
    digest = hashlib.sha256()
    sizes = [(48, 32), (32, 48), (90, 20), (20, 90), (33, 33), (300, 37), (17, 200), (8, 8)]
    for seed, size in enumerate(sizes):
        for resolution in (16, 24):
            for crop, flip in (("center", False), ("random", True), ("none", False)):
                image = _noise(size, seed)
                digest.update(to_model_input(image, resolution, crop, flip, torch.Generator().manual_seed(seed))
                              .numpy().tobytes())  # fmt: skip
    assert digest.hexdigest() == "38f6822d76b0b2229d6710240ef04a1472d7ed43e0669293378b65fd09c9bb47"


@pytest.mark.parametrize("size", [(10, 20000), (20000, 10)])
@pytest.mark.parametrize("crop", ["center", "random"])
def test_an_elongated_image_is_cropped_before_it_is_resized(monkeypatch, size, crop):
    """Resizing a 10 x 20000 image's short side to 256 would make a 256 x 512000 image (GBs at 1024 px): the
    square is cut out of the original first, so memory stays bounded by the target size."""
    resize = Image.Image.resize
    requested = []

    def bounded_resize(self, size, *args, **kwargs):
        requested.append(size)
        assert size[0] * size[1] <= 16 * 256 * 256, f"a resize to {size}"
        return resize(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", bounded_resize)
    pixels = to_model_input(_bands(size), 256, crop, generator=torch.Generator().manual_seed(0))
    assert pixels.shape == (3, 256, 256) and requested
    if crop == "center":
        assert torch.equal(pixels, torch.tensor([-1.0, 1.0, -1.0]).view(3, 1, 1).expand(3, 256, 256))


def test_decompression_bombs_are_skipped_and_counted_like_unreadable_images(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # PIL warns above this many pixels, refuses above twice
    files = {"warned.png": _png(size=(40, 40)), "refused.png": _png(size=(50, 50)), "good.png": _png(size=(30, 30))}
    _image_folder(tmp_path, [{"file_name": n, "text": n} for n in files], files)
    item = ImageFolderDataset(tmp_path, resolution=8)[0]
    assert item["caption"] == "good.png"
    assert [record.split(":")[0] for record in item["bad_files"]] == ["warned.png", "refused.png"]
    assert all("DecompressionBomb" in record for record in item["bad_files"])


def _failing_conversion(monkeypatch, size=(7, 7)) -> None:
    """Plant a failure in the transform (after decoding) for images of ``size``."""
    from dit_trainer.data import transforms

    to_rgb = transforms.to_rgb

    def failing(image):
        if image.size == size:
            raise OSError("broken colour profile")
        return to_rgb(image)

    monkeypatch.setattr(transforms, "to_rgb", failing)


def test_an_image_that_fails_in_the_transform_is_skipped_and_counted(tmp_path, monkeypatch):
    _failing_conversion(monkeypatch)
    files = {"odd.png": _png(size=(7, 7)), "good.png": _png()}
    _image_folder(tmp_path, [{"file_name": n, "text": n} for n in files], files)
    item = ImageFolderDataset(tmp_path, resolution=8)[0]
    assert item["caption"] == "good.png" and item["bad_files"] == ["odd.png: OSError: broken colour profile"]
    samples = [{"__key__": "odd", "png": _png(size=(7, 7)), "txt": "odd"},
               {"__key__": "good", "png": _png(), "txt": "good"}]  # fmt: skip
    items = list(WebDatasetSource(_write_shards(tmp_path, [samples]), 8))
    assert [i["caption"] for i in items] == ["good"]
    assert items[0]["bad_files"][0].endswith("odd: OSError: broken colour profile")


def test_webdataset_captions_that_are_not_utf8_or_not_objects_are_skipped_and_counted(tmp_path):
    samples = [{"__key__": "latin", "png": _png(), "txt": "\xe9t\xe9".encode("latin-1")},
               {"__key__": "number", "png": _png(), "json": b"42"},
               {"__key__": "good", "png": _png(), "txt": "good"}]  # fmt: skip
    items = list(WebDatasetSource(_write_shards(tmp_path, [samples]), 8))
    assert [i["caption"] for i in items] == ["good"]
    assert [record.split(": ", 1)[1] for record in items[0]["bad_files"]] == [
        "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9 in position 0: invalid continuation byte",
        "ValueError: the .json member is a JSON number, not an object",
    ]
