"""``scripts/preview_data.py`` (``preview.py``): the training data as the model sees them, written without building
any model; an out_dir holding its files is refused and left as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from dit_trainer.data.sources.transforms import to_model_input
from tests.conftest import TINY_SHAPES, digest, run_here

# name: (width, height, caption). Six images, one per aspect; the left half red, the top half blue.
IMAGES = {
    "wide.png": (200, 100, "a wide one"),
    "tall.png": (90, 180, "a tall one"),
    "square.png": (120, 120, "a square one"),
    "gray.png": (100, 100, "a grey one"),  # mode L: reaches the model as RGB
    "panorama.jpg": (300, 100, "a panorama"),
    "portrait.png": (100, 150, "a portrait"),
}
BUCKETED = ["data=imagefolder", "data.resolution=64", "data.buckets=pixart", "trainer.batch_size=1",
            "data.num_workers=0", "validation.every_n_steps=0"]  # fmt: skip


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    with (folder / "metadata.jsonl").open("w") as metadata:
        for name, (width, height, caption) in IMAGES.items():
            pixels = np.zeros((height, width, 3), np.uint8)
            pixels[:, : width // 2, 0] = 255
            pixels[: height // 2, :, 2] = 255
            image = Image.fromarray(pixels)
            (image.convert("L") if name == "gray.png" else image).save(folder / name)
            metadata.write(json.dumps({"file_name": name, "text": caption}) + "\n")
    return folder


def _preview(*args: str):
    return run_here(["scripts/preview_data.py", *TINY_SHAPES, *args])


def test_preview_writes_each_item_as_trained_with_its_caption_and_bucket(photos, tmp_path, monkeypatch):
    def no_models(*args, **kwargs):
        raise AssertionError("the preview built the models")

    import dit_trainer.apps.inference  # noqa: F401  imported unpatched: a module first imported now would keep it

    monkeypatch.setattr("dit_trainer.components.build.build_components", no_models)
    out = tmp_path / "preview"
    result = _preview(*BUCKETED, f"data.path={photos}", f"out_dir={out}", "n=10")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Wrote 6 images as the model sees them" in result.stdout

    records = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert sorted(record["caption"] for record in records) == sorted(caption for *_, caption in IMAGES.values())
    source = {caption: name for name, (*_, caption) in IMAGES.items()}
    for record in records:
        height, width = map(int, record["bucket"].split("x"))
        shown = np.array(Image.open(out / record["file"]))
        assert shown.shape == (height, width, 3)  # the bucket's size, the aspect kept
        expected = to_model_input(Image.open(photos / source[record["caption"]]), (height, width))
        assert torch.equal(torch.from_numpy(shown).permute(2, 0, 1), expected)  # the pixels the model gets
    buckets = {record["caption"]: record["bucket"] for record in records}
    assert buckets["a wide one"] == "48x96" and buckets["a tall one"] == "96x48" and buckets["a square one"] == "64x64"
    assert Image.open(out / "contact_sheet.png").width == 6 * 128

    before = digest(out)
    again = _preview(*BUCKETED, f"data.path={photos}", f"out_dir={out}", "n=2")
    assert again.returncode == 2 and "`out_dir`" in again.stderr and "never overwrites" in again.stderr
    assert "Traceback" not in again.stderr and digest(out) == before


def test_preview_leaves_out_held_out_items_and_asks_for_an_out_dir(tmp_path):
    out = tmp_path / "preview"
    result = _preview("validation.every_n_steps=10", "validation.split=0.25", f"out_dir={out}", "n=300")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Wrote 192 images" in result.stdout and "not shown: 64 items held out for validation" in result.stdout
    records = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert len(records) == 192 and {record["bucket"] for record in records} == {"32x32"}
    assert all(record["caption"] for record in records)

    missing = _preview("n=1")
    assert missing.returncode == 2 and "`out_dir`" in missing.stderr and "Traceback" not in missing.stderr

    for n in ("0", "-5"):  # refused before anything is written: no empty contact sheet blocks the next try
        refused = _preview(f"out_dir={tmp_path / 'none'}", f"n={n}")
        assert refused.returncode == 2 and f"`n` is {n}, but it must be >= 1" in refused.stderr
        assert "Traceback" not in refused.stderr and not (tmp_path / "none").exists()


def test_a_key_mistyped_from_the_previews_own_is_named_with_the_one_meant():
    """It went to train.py's key check, which offered `optim.lr`."""
    from dit_trainer.apps.cli import parse_cli
    from dit_trainer.apps.preview import split_arguments
    from dit_trainer.config import PreviewConfig
    from dit_trainer.errors import ConfigError

    own, overrides = split_arguments(["outdir=/x", "data.resolution=32", "n=4", "data=imagefolder"])
    assert own == ["outdir=/x", "n=4"] and overrides == ["data.resolution=32", "data=imagefolder"]
    with pytest.raises(ConfigError, match=r"`outdir`.*not an argument of this command \(the closest: `out_dir`\)"):
        parse_cli(PreviewConfig, own)


def test_a_clip_is_previewed_as_its_frames_side_by_side(tmp_path):
    """A clip source's items are (3, F, H, W): each is written as a strip of its frames, its bucket a frame's size.
    It was a traceback that left an empty 00000.png, which then refused the rerun."""
    out = tmp_path / "preview"
    result = run_here(["scripts/preview_data.py", "+experiment=moving_shapes", "data.frames=4", "data.length=8",
                       "trainer.batch_size=4", "validation.every_n_steps=0", f"out_dir={out}", "n=2"])  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    assert [record["bucket"] for record in records] == ["32x32", "32x32"]
    assert Image.open(out / "00000.png").size == (4 * 32, 32)


def test_a_file_whose_writing_fails_is_removed(tmp_path):
    """Never left half-written: it would block the command's own rerun (which never overwrites)."""
    from dit_trainer.apps.inference import new_file

    with pytest.raises(ValueError), new_file(tmp_path / "00000.png") as file:
        file.write(b"\x89PNG")
        raise ValueError("the encoder failed")
    assert not (tmp_path / "00000.png").exists()


def test_a_mixture_is_previewed_as_its_weights_draw_it(tmp_path):
    """Two folders of 12 images weighted 3:1: an epoch's 24 items are 18 and 6, as training draws them (the preview
    drew uniformly over both: 12 and 12)."""
    from tests.data.files import image_folder, png_bytes

    folders = []
    for name in ("photos", "drawings"):
        (tmp_path / name).mkdir()
        rows = [{"file_name": f"{i}.png", "text": f"a {name[:-1]}"} for i in range(12)]
        folders.append(image_folder(tmp_path / name, rows, {row["file_name"]: png_bytes() for row in rows}))
    mixture = f"data.mixture=[{{path: {folders[0]}, weight: 3}}, {{path: {folders[1]}, weight: 1}}]"
    out = tmp_path / "preview"
    result = _preview("data=imagefolder", mixture, "data.resolution=32", "data.num_workers=0", "trainer.batch_size=4",
                      "validation.every_n_steps=0", f"out_dir={out}", "n=24")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    captions = [json.loads(line)["caption"] for line in (out / "index.jsonl").read_text().splitlines()]
    assert (captions.count("a photo"), captions.count("a drawing")) == (18, 6)
