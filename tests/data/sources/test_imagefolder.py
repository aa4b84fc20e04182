"""A folder of images described by ``metadata.jsonl`` (``data/sources/imagefolder.py``): only listed images, in RGB and
in range; bad metadata named by line; unreadable files and decompression bombs skipped and reported; caption columns."""

import json

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.imagefolder import ImageFolderDataset
from dit_trainer.errors import ConfigError
from tests.conftest import one_paragraph
from tests.data.files import CORRUPT, image_folder, png_bytes


def _write(folder, rows):
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_only_listed_images_are_used_and_converted_to_rgb_in_range(tmp_path):
    Image.new("L", (64, 32), 255).save(tmp_path / "gray.png")
    Image.new("RGBA", (20, 40), (0, 0, 255, 0)).save(tmp_path / "clear.png")  # fully transparent -> white
    Image.new("RGB", (8, 8)).save(tmp_path / "stray.png")
    (tmp_path / "sub").mkdir()
    Image.new("RGB", (30, 30), (255, 0, 0)).save(tmp_path / "sub" / "red.jpg")
    _write(
        tmp_path,
        [
            {"file_name": "gray.png", "text": "g"},
            {"file_name": "clear.png", "text": "c"},
            {"file_name": "sub/red.jpg", "text": "r"},
        ],
    )
    dataset = ImageFolderDataset(tmp_path, resolution=16)
    assert len(dataset) == 3
    items = [dataset[i] for i in range(3)]
    assert [item["caption"] for item in items] == ["g", "c", "r"]
    for item in items:
        assert item["image"].shape == (3, 16, 16) and item["image"].dtype == torch.uint8
    assert torch.equal(items[0]["image"], torch.full((3, 16, 16), 255, dtype=torch.uint8))
    assert torch.equal(items[1]["image"], torch.full((3, 16, 16), 255, dtype=torch.uint8))
    assert items[2]["image"][0].float().mean() > 242 and items[2]["image"][1:].float().mean() < 13


def test_bad_metadata_names_the_line_and_the_fix(tmp_path):
    _write(tmp_path, [{"file_name": "a.png", "caption": "x"}])
    with pytest.raises(ConfigError, match="data.caption_column"):
        ImageFolderDataset(tmp_path, resolution=16)
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "x"}\n{"text": "y"}\n')
    with pytest.raises(ConfigError, match=r"`data.path`.*line 2 .* has keys \['text'\] and no `file_name`"):
        ImageFolderDataset(tmp_path, resolution=16)  # not blamed on the caption key, which is there
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "x"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2"):
        ImageFolderDataset(tmp_path, resolution=16)
    (tmp_path / "metadata.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="lists no images"):
        ImageFolderDataset(tmp_path, resolution=16)


def test_unreadable_images_are_skipped_and_named_until_none_is_left(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not a png")
    Image.new("RGB", (8, 8)).save(tmp_path / "good.png")
    rows = [{"file_name": name, "text": name} for name in ("broken.png", "missing.png", "good.png")]
    _write(tmp_path, rows)
    dataset = ImageFolderDataset(tmp_path, resolution=16)
    assert dataset[0]["caption"] == "good.png" and dataset[1]["caption"] == "good.png"
    assert dataset[0]["bad_files"] == ["broken.png: not an image PIL can read"]  # the stand-in counts as its own
    assert dataset[1]["bad_files"] == ["missing.png: file not found"]
    _write(tmp_path, rows[:2])
    with pytest.raises(ConfigError, match=r"data.path.*every one of the last 2 files was unreadable.*broken.png"):
        ImageFolderDataset(tmp_path, resolution=16)[1]


def skipped_records(dataset) -> list[str]:
    """The unreadable files of one pass over ``dataset``: each item names its own file when it was skipped."""
    return [record for index in range(len(dataset)) for record in dataset[index].get("bad_files", [])]


def _assert_all_corrupt_reported(bad_files: list[str]) -> None:
    for name in CORRUPT:
        assert any(name in record for record in bad_files), (name, bad_files)
    assert any("file not found" in record for record in bad_files)
    assert any("ValueError: empty file (0 bytes)" in record for record in bad_files)


def test_imagefolder_skips_unreadable_files_and_reports_them_in_the_batch(tmp_path):
    names = ["good0.png", *CORRUPT, "good1.png"]
    files = {"good0.png": png_bytes((255, 0, 0)), **CORRUPT, "good1.png": png_bytes((0, 0, 255))}
    image_folder(tmp_path, [{"file_name": n, "text": n} for n in names], files)
    dataset = ImageFolderDataset(tmp_path, resolution=16)
    batch = next(iter(DataLoader(dataset, batch_size=len(names), collate_fn=collate_batch, num_workers=0)))
    # Items 1-4 are unreadable: each is replaced by the next readable file, good1.png.
    assert batch["caption"] == ["good0.png"] + ["good1.png"] * 5
    assert batch["image"].shape == (6, 3, 16, 16)
    _assert_all_corrupt_reported(batch["bad_files"])
    assert "bad_files" not in dataset[0]
    # Each item names its own file only: a cluster of bad files counts each once, not once per stand-in tried.
    assert dataset[1]["bad_files"] == ["truncated.png: OSError: image file is truncated"]
    assert sum(len(dataset[i].get("bad_files", [])) for i in range(len(names))) == len(CORRUPT)


def test_imagefolder_gives_up_after_100_unreadable_files_in_a_row(tmp_path):
    files = {f"{i:03d}.png": b"" for i in range(120)} | {"good.png": png_bytes()}
    image_folder(tmp_path, [{"file_name": n, "text": "x"} for n in files], files)
    dataset = ImageFolderDataset(tmp_path, resolution=8)
    assert dataset[30]["bad_files"] == ["030.png: ValueError: empty file (0 bytes)"]  # 031..119 tried, then good.png
    with pytest.raises(ConfigError, match=r"data.path.*every one of the last 100 files was unreadable"):
        dataset[0]


def test_imagefolder_caption_columns_draw_among_columns(tmp_path):
    image_folder(tmp_path, [{"file_name": "a.png", "short": "red", "long": "a red square"}], {"a.png": png_bytes()})
    dataset = ImageFolderDataset(tmp_path, resolution=8, caption_columns=["short", "long"])
    torch.manual_seed(0)
    assert {dataset[0]["caption"] for _ in range(40)} == {"red", "a red square"}
    with pytest.raises(ConfigError, match="data.caption_columns"):
        ImageFolderDataset(tmp_path, resolution=8, caption_columns=["short", "medium"])


def test_decompression_bombs_are_skipped_and_counted_like_unreadable_images(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # PIL warns above this many pixels, refuses above twice
    files = {
        "warned.png": png_bytes(size=(40, 40)),
        "refused.png": png_bytes(size=(50, 50)),
        "good.png": png_bytes(size=(30, 30)),
    }
    image_folder(tmp_path, [{"file_name": n, "text": n} for n in files], files)
    dataset = ImageFolderDataset(tmp_path, resolution=8)
    assert dataset[0]["caption"] == "good.png"
    records = skipped_records(dataset)
    assert [record.split(":")[0] for record in records] == ["warned.png", "refused.png"]
    assert all("DecompressionBomb" in record for record in records)


@pytest.mark.parametrize(
    ("line", "reason"),
    [(b"42", "is a JSON number, not an object"), (b"[1]", "is a JSON array, not an object"),
     (b"null", "is a JSON null, not an object"), (b'"a.png"', "is a JSON string, not an object"),
     ('{"file_name": "1.png", "text": "\xe9t\xe9"}'.encode("latin-1"), "not UTF-8")],
    ids=["number", "list", "null", "string", "latin-1"],
)  # fmt: skip
def test_a_metadata_line_that_is_not_a_utf8_json_object_names_the_line(tmp_path, line, reason):
    (tmp_path / "metadata.jsonl").write_bytes(b'{"file_name": "0.png", "text": "a"}\n' + line + b"\n")
    with pytest.raises(ConfigError) as caught:
        ImageFolderDataset(tmp_path, resolution=16)
    message = one_paragraph(caught.value, "data.path")
    assert "line 2 of metadata.jsonl" in message and reason in message


def test_class_folders_read_only_visible_images_of_folders_that_hold_some(tmp_path, caplog):
    """As torchvision's ImageFolder: a class's images in nested folders are its images too, and images beside the
    class folders belong to none (said, not silently dropped)."""
    for folder in ("cat/kitten", "cat/.ipynb_checkpoints", ".git", "empty", "dog/puppy"):
        (tmp_path / folder).mkdir(parents=True)
    for name in ("cat/1.png", "cat/0.png", "cat/kitten/2.png", "cat/.ipynb_checkpoints/0.png", ".git/0.png",
                 "dog/puppy/3.png", "loose.png"):  # fmt: skip
        (tmp_path / name).write_bytes(png_bytes())
    (tmp_path / "cat" / "._0.png").write_bytes(b"macOS metadata")
    dataset = ImageFolderDataset(tmp_path, resolution=8)
    assert dataset.records == [("cat/0.png", ("cat",)), ("cat/1.png", ("cat",)), ("cat/kitten/2.png", ("cat",)),
                               ("dog/puppy/3.png", ("dog",))]  # fmt: skip
    assert "hold no images are no classes and are ignored: .git, empty" in caplog.text
    assert "are in no class folder and are ignored: loose.png" in caplog.text


@pytest.mark.parametrize("name", ["../outside.png", "/tmp/outside.png", "sub/../../outside.png"])
def test_a_metadata_name_outside_the_folder_is_refused_naming_the_line(tmp_path, name):
    folder = tmp_path / "data"
    folder.mkdir()
    (tmp_path / "outside.png").write_bytes(png_bytes())
    _write(folder, [{"file_name": "sub/../0.png", "text": "inside"}, {"file_name": name, "text": "outside"}])
    with pytest.raises(ConfigError) as caught:
        ImageFolderDataset(folder, resolution=8)
    message = one_paragraph(caught.value, "data.path")
    assert f"line 2 of metadata.jsonl names {name!r}, outside that folder" in message


def test_links_out_of_the_folder_and_files_that_are_not_regular_are_skipped_as_unreadable(tmp_path):
    """A FIFO would block the loader forever, a folder named like an image would fail obscurely, and a link out of
    the folder would read what the user never gave the run."""
    import os

    folder = tmp_path / "data"
    (folder / "dir.png").mkdir(parents=True)
    os.mkfifo(folder / "fifo.png")
    (tmp_path / "secret.png").write_bytes(png_bytes())
    (folder / "link.png").symlink_to(tmp_path / "secret.png")
    (folder / "good.png").write_bytes(png_bytes())
    (folder / "inner.png").symlink_to(folder / "good.png")  # a link inside the folder is read
    (folder / "loop.png").symlink_to(folder / "back.png")
    (folder / "back.png").symlink_to(folder / "loop.png")
    names = ["dir.png", "fifo.png", "link.png", "loop.png", "inner.png"]
    _write(folder, [{"file_name": name, "text": name} for name in names])
    dataset = ImageFolderDataset(folder, resolution=8)
    assert dataset[0]["caption"] == "inner.png" and [dataset.image_size(i) for i in range(5)] == [None] * 4 + [(24, 16)]
    *records, loop = skipped_records(dataset)
    assert records == [
        "dir.png: ValueError: not a regular file (a folder)",
        "fifo.png: ValueError: not a regular file (a FIFO)",
        f"link.png: ValueError: a link to {tmp_path / 'secret.png'}, outside the data folder, is not followed",
    ]
    assert loop.startswith("loop.png: ")  # Python 3.11's resolve raises RuntimeError, open raises ELOOP


def test_a_folder_of_videos_read_as_images_is_refused_naming_the_video_source(tmp_path):
    """An image family pointed at a folder of MP4s: every file "not an image PIL can read", and the advice was to
    check that the files are complete."""
    import numpy as np

    from dit_trainer.data.sources.videofolder import write_mp4

    for index in range(2):
        write_mp4(np.zeros((3, 16, 16, 3), dtype=np.uint8), tmp_path / f"{index}.mp4", 8)
    (tmp_path / "metadata.jsonl").write_text("".join(json.dumps({"file_name": f"{i}.mp4", "text": "x"}) + "\n"
                                                     for i in range(2)))  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        ImageFolderDataset(tmp_path, resolution=16)[0]
    message = one_paragraph(refused.value, "data.source")
    assert "it is a video, and this source reads images" in message and "`data=videofolder`" in message
