import json

import pytest
import torch
from PIL import Image

from dit_trainer.data.imagefolder import ImageFolderDataset
from dit_trainer.errors import ConfigError


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
        assert item["image"].shape == (3, 16, 16)
        assert item["image"].min() >= -1 and item["image"].max() <= 1
    assert torch.allclose(items[0]["image"], torch.ones(3, 16, 16))
    assert torch.allclose(items[1]["image"], torch.ones(3, 16, 16))
    assert items[2]["image"][0].mean() > 0.9 and items[2]["image"][1:].mean() < -0.9


def test_bad_metadata_names_the_line_and_the_fix(tmp_path):
    _write(tmp_path, [{"file_name": "a.png", "caption": "x"}])
    with pytest.raises(ConfigError, match="data.caption_column"):
        ImageFolderDataset(tmp_path, resolution=16)
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
    item = ImageFolderDataset(tmp_path, resolution=16)[0]
    assert item["caption"] == "good.png"
    assert item["bad_files"] == ["broken.png: not an image PIL can read", "missing.png: file not found"]
    _write(tmp_path, rows[:2])
    with pytest.raises(ConfigError, match=r"data.path.*every one of the last 2 files was unreadable.*broken.png"):
        ImageFolderDataset(tmp_path, resolution=16)[1]
