"""A Hugging Face ``datasets`` data set (``data/sources/hf.py``): a saved data set, a data set dict's split, a local
data folder; unreadable rows reported, bad paths, columns and metadata named."""

import datasets
import pytest
import torch
from torch.utils.data import DataLoader

from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.hf import HFImageDataset
from dit_trainer.errors import ConfigError
from tests.conftest import one_paragraph
from tests.data.files import CORRUPT, HF_FEATURES, assert_in_range, image_folder, png_bytes


def test_hf_saved_dataset_yields_images_and_reports_unreadable_rows(tmp_path):
    corrupt = {name: data for name, data in CORRUPT.items() if data is not None}  # save_to_disk embeds files
    images = [{"bytes": png_bytes((40 * i, 0, 0)), "path": None} for i in range(3)]
    images += [{"bytes": data, "path": name} for name, data in corrupt.items()]
    rows = {"image": images, "text": [f"good {i}" for i in range(3)] + list(corrupt)}
    datasets.Dataset.from_dict(rows, features=HF_FEATURES).save_to_disk(tmp_path / "saved")
    dataset = HFImageDataset(str(tmp_path / "saved"), resolution=16)
    assert len(dataset) == 6
    batch = next(iter(DataLoader(dataset, batch_size=6, collate_fn=collate_batch, num_workers=0)))
    for image in batch["image"]:
        assert_in_range(image, 16)
    # Rows 3-5 are unreadable: the search wraps around to row 0. Each is counted once, by its own row.
    assert batch["caption"] == ["good 0", "good 1", "good 2"] + ["good 0"] * 3
    assert batch["image"][1, 0].float().mean() > batch["image"][0, 0].float().mean()  # row 1 is redder than row 0
    assert batch["bad_files"] == [
        "row 3 (truncated.png): OSError: image file is truncated",
        "row 4 (empty.png): ValueError: empty file (0 bytes)",
        "row 5 (text.jpg): not an image PIL can read",
    ]


def test_hf_dataset_dict_split_and_caption_columns(tmp_path):
    rows = {"image": [{"bytes": png_bytes(), "path": None}] * 2, "short": ["red", "red"], "long": ["a red box"] * 2}
    train = datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image())
    datasets.DatasetDict({"train": train, "test": train.select([0])}).save_to_disk(tmp_path / "dict")
    dataset = HFImageDataset(str(tmp_path / "dict"), 8, split="test", caption_columns=["short", "long"])
    assert len(dataset) == 1
    torch.manual_seed(0)
    assert {dataset[0]["caption"] for _ in range(40)} == {"red", "a red box"}
    with pytest.raises(ConfigError, match=r"data.split.*\['test', 'train'\]"):
        HFImageDataset(str(tmp_path / "dict"), 8, split="validation")
    train.save_to_disk(tmp_path / "one")  # a single data set: a split asked of it was ignored, the whole set read
    assert len(HFImageDataset(str(tmp_path / "one"), 8, caption_column="short")) == 2
    with pytest.raises(ConfigError, match=r"`data.split` is 'test'.*is one split \(unnamed\), saved without"):
        HFImageDataset(str(tmp_path / "one"), 8, split="test", caption_column="short")


def test_a_column_of_caption_lists_offers_each_and_a_caption_that_is_not_text_is_unreadable(tmp_path):
    """COCO's layout (five captions per image in one column): one of them is drawn, not the list's Python text. A
    number or an empty list is not a caption: the row is skipped and reported, not trained as "7" or "[]"."""
    for name, captions in {"lists": [["a red box", "red"], []], "numbers": [7, 8]}.items():
        rows = {"image": [{"bytes": png_bytes(), "path": None}] * 2, "text": captions}
        datasets.Dataset.from_dict(rows).cast_column("image", datasets.Image()).save_to_disk(tmp_path / name)
    lists, numbers = HFImageDataset(str(tmp_path / "lists"), 8), HFImageDataset(str(tmp_path / "numbers"), 8)
    torch.manual_seed(0)
    assert {lists[0]["caption"] for _ in range(40)} == {"a red box", "red"}
    assert lists[1]["bad_files"] == ["row 1: ValueError: the caption is [], not a text or a list of texts"]
    with pytest.raises(ConfigError, match=r"unreadable \(the first: row 0: ValueError: the caption is 7, not a text"):
        numbers[0]  # a column of numbers: every row unreadable


def test_hf_local_data_folder_loads_with_load_dataset(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # keep ~/.cache clean
    folder = tmp_path / "folder"
    folder.mkdir()
    rows = [{"file_name": f"{i}.png", "text": f"caption {i}"} for i in range(3)]
    image_folder(folder, rows, {f"{i}.png": png_bytes() for i in range(3)})
    dataset = HFImageDataset(str(folder), resolution=8)
    assert sorted(item["caption"] for item in dataset) == ["caption 0", "caption 1", "caption 2"]
    assert_in_range(dataset[0]["image"], 8)
    (folder / "1.png").unlink()  # rows refer to the files by path: a file deleted since is skipped
    assert [item.get("bad_files") for item in dataset] == [None, [f"row 1 ({folder / '1.png'}): file not found"], None]


def test_hf_bad_path_and_columns_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"`data.path` is 'no-such-user/no-such-data'.*HF_HUB_OFFLINE"):
        HFImageDataset("no-such-user/no-such-data", 8)
    with pytest.raises(ConfigError, match="data.path"):
        HFImageDataset(str(tmp_path / "nothing here"), 8)
    rows = {"img": [{"bytes": png_bytes(), "path": None}], "caption": ["x"], "label": [3]}
    datasets.Dataset.from_dict(rows).cast_column("img", datasets.Image()).save_to_disk(tmp_path / "saved")
    path = str(tmp_path / "saved")
    with pytest.raises(ConfigError, match=r"data.image_column.*img, caption, label"):
        HFImageDataset(path, 8, caption_column="caption")
    with pytest.raises(ConfigError, match=r"data.caption_column.*img, caption, label"):
        HFImageDataset(path, 8, image_column="img")
    with pytest.raises(ConfigError, match="data.image_column.*not images"):
        HFImageDataset(path, 8, image_column="label", caption_column="caption")
    with pytest.raises(ConfigError, match=r"`data.image_column` is 'img'.*for the images and for the captions"):
        HFImageDataset(path, 8, image_column="img", caption_column="img")  # was pyarrow's KeyError
    with pytest.raises(ConfigError, match=r"`data.caption_columns` is \['caption', 'caption'\].*'caption' twice"):
        HFImageDataset(path, 8, image_column="img", caption_columns=["caption", "caption"])
    assert HFImageDataset(path, 8, image_column="img", caption_column="caption")[0]["caption"] == "x"


def test_an_hf_data_folder_with_metadata_that_is_not_utf8_names_the_cause(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # keep ~/.cache clean
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "0.png").write_bytes(png_bytes((200, 30, 30), (16, 16)))
    (tmp_path / "images" / "metadata.jsonl").write_bytes(
        '{"file_name": "0.png", "text": "\xe9t\xe9"}\n'.encode("latin-1")
    )
    with pytest.raises(ConfigError) as caught:
        HFImageDataset(str(tmp_path / "images"), 16)
    assert "caused by UnicodeDecodeError" in one_paragraph(caught.value, "data.path")
