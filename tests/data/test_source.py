"""The configured data source (``data/source.py``): ``build_dataset`` builds the source ``data.source`` names."""

import datasets

from dit_trainer.config import DataConfig
from dit_trainer.data.hf import HFImageDataset
from dit_trainer.data.imagefolder import ImageFolderDataset
from dit_trainer.data.shapes import ShapesDataset
from dit_trainer.data.source import build_dataset
from dit_trainer.data.webdataset import WebDatasetSource

from .files import assert_in_range, image_folder, png_bytes, write_shards


def test_build_dataset_dispatches_on_source(tmp_path):
    image_folder(tmp_path, [{"file_name": "a.png", "text": "a"}], {"a.png": png_bytes()})
    pattern = write_shards(tmp_path, [[{"__key__": "a", "png": png_bytes(), "txt": "a"}]])
    datasets.Dataset.from_dict({"image": [{"bytes": png_bytes(), "path": None}], "text": ["a"]}).cast_column(
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
        assert_in_range(item["image"], 8)
