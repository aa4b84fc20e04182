import json

import pytest
import torch
from PIL import Image

from dit_trainer.config import ConfigError
from dit_trainer.data import ImageFolderDataset


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


def test_unreadable_image_names_the_file(tmp_path):
    (tmp_path / "broken.png").write_bytes(b"not a png")
    _write(tmp_path, [{"file_name": "broken.png", "text": "x"}, {"file_name": "missing.png", "text": "y"}])
    dataset = ImageFolderDataset(tmp_path, resolution=16)
    for index, name in enumerate(["broken.png", "missing.png"]):
        with pytest.raises(ConfigError, match=name):
            dataset[index]
