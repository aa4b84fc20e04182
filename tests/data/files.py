"""Small data sets written for the data tests (and for the other tests that need files to read, in tests/training
and tests/e2e): images, image folders, webdataset shards, unreadable files, aspect-ratio bucket folders, a second
source to mix in, and captioned folders for validation."""

import io
import json
import tarfile
from pathlib import Path

import datasets
import numpy as np
import torch
import webdataset
from PIL import Image

from dit_trainer.data.sources.moving_shapes import write_moving_shapes_folder
from dit_trainer.data.sources.shapes import write_shapes_folder

from ..conftest import TINY_SHAPES


def png_bytes(color=(255, 0, 0), size=(24, 16)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


def noise_image(size=(48, 32), seed=0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def noise_png(seed=0) -> bytes:
    buffer = io.BytesIO()
    noise_image(seed=seed).save(buffer, "PNG")
    return buffer.getvalue()


# Each kind of unreadable image: name -> bytes (None: the file does not exist).
CORRUPT = {
    "truncated.png": noise_png()[:300],
    "empty.png": b"",
    "text.jpg": b"this is a caption file renamed to .jpg\n",
    "missing.png": None,
}


def assert_in_range(image: torch.Tensor, resolution: int) -> None:
    """A source's image: uint8 pixels when decoded from a file, float in [-1, 1] when made procedurally (shapes)."""
    assert image.shape == (3, resolution, resolution) and image.dtype in (torch.uint8, torch.float32)
    assert image.dtype == torch.uint8 or (image.min() >= -1 and image.max() <= 1)


def image_folder(root, rows, files):
    for name, data in files.items():
        if data is not None:
            (root / name).write_bytes(data)
    (root / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


HF_FEATURES = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})


def write_shards(folder, samples_per_shard: list[list[dict]]) -> str:
    """Shards 000000.tar, ... written with webdataset's own TarWriter; returns the brace pattern."""
    for index, samples in enumerate(samples_per_shard):
        with webdataset.TarWriter(str(folder / f"{index:06d}.tar")) as writer:
            for sample in samples:
                writer.write(sample)
    return str(folder / f"{{000000..{len(samples_per_shard) - 1:06d}}}.tar")


# --- aspect-ratio buckets -----------------------------------------------------------------------------------------


SIZES = [(32, 32), (24, 40), (40, 24)]  # (height, width): square, landscape, portrait
BUCKETS = "data.buckets=[[32,32],[24,40],[40,24]]"
CANVASES = [(32, 32), (32, 56), (44, 32)]  # 1:1, 16:9 and 3:4 renders


def bucketed(folder) -> list[str]:
    """TINY_SHAPES' model on a folder of images, in buckets."""
    return ["data=imagefolder", f"data.path={folder}", "data.resolution=32", "data.num_workers=0", BUCKETS,
            "trainer.batch_size=4"]  # fmt: skip


def shards_of(folder, root) -> str:
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


# --- mixtures and validation ----------------------------------------------------------------------------------------


def photos_folder(folder, count: int, bad: int = 0):
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


def mixture_overrides(tmp_path, *extra: str) -> list[str]:
    """TINY_SHAPES on a mixture of two image folders written under ``tmp_path``: 40 shapes (weight 3) and
    ``photos_folder``'s 38 photos and 2 truncated files (weight 1)."""
    shapes = write_shapes_folder(tmp_path / "shapes", 40, [(32, 32)])
    photos = photos_folder(tmp_path / "photos", 38, bad=2)
    mixture = (
        f"data.mixture=[{{source:imagefolder,path:{shapes},weight:3}},{{source:imagefolder,path:{photos},name:photos}}]"
    )
    return [*TINY_SHAPES, mixture, "data.resolution=32", "data.num_workers=0", "trainer.batch_size=4", *extra]


def captioned_folder(folder, count: int) -> None:
    """``count`` 32-px images, each with its own caption ``image <i>``, so a caption identifies an image."""
    folder.mkdir()
    with (folder / "metadata.jsonl").open("w") as metadata:
        for i in range(count):
            Image.new("RGB", (32, 32), (i * 6, 255 - i * 6, 128)).save(folder / f"{i}.png")
            metadata.write(json.dumps({"file_name": f"{i}.png", "text": f"image {i}"}) + "\n")


def video_folder_shards(clips: Path, folder: Path, extra: list[dict] = (), shards: int = 2) -> str:
    """The clips of the video folder ``clips`` (``mp4`` and ``txt`` members) and the samples ``extra`` after them,
    dealt over ``shards`` tar shards in ``folder``; returns the brace pattern."""
    rows = [json.loads(line) for line in (clips / "metadata.jsonl").read_text().splitlines()]
    samples = [{"__key__": Path(row["file_name"]).stem, "mp4": (clips / row["file_name"]).read_bytes(),
                "txt": row["text"]} for row in rows] + list(extra)  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    return write_shards(folder, [samples[shard::shards] for shard in range(shards)])


def clip_shards(folder, count: int, extra: list[dict] = (), shards: int = 2, frames: int = 5) -> str:
    """``count`` moving-shapes clips of ``frames`` frames at 32 px and the samples ``extra`` after them as
    ``shards`` tar shards (``video_folder_shards``); returns the brace pattern."""
    clips = write_moving_shapes_folder(folder / "folder", count, frames=frames, resolution=32)
    return video_folder_shards(clips, folder, extra, shards)


def captioned_shards(folder, shards: int, per_shard: int, bad: int = 0) -> str:
    """``shards`` tar shards of ``per_shard`` 48x32 images captioned ``shard <s> <i>`` (each caption names its
    image), the first ``bad`` samples of each shard truncated PNGs; returns the brace pattern."""
    folder.mkdir()
    samples = [
        [{"__key__": f"s{s}_{i:03d}", "png": noise_png(s * per_shard + i)[: 300 if i < bad else None],
          "txt": f"shard {s} {i}"} for i in range(per_shard)]
        for s in range(shards)
    ]  # fmt: skip
    return write_shards(folder, samples)
