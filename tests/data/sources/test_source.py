"""The configured data source (``data/sources/source.py``): ``build_dataset`` builds the source ``data.source``
names."""

import datasets

from dit_trainer.config import DataConfig
from dit_trainer.data.sources.hf import HFImageDataset
from dit_trainer.data.sources.imagefolder import ImageFolderDataset
from dit_trainer.data.sources.shapes import ShapesDataset
from dit_trainer.data.sources.source import build_dataset
from dit_trainer.data.sources.webdataset import WebDatasetSource
from tests.data.files import assert_in_range, image_folder, png_bytes, write_shards


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


def test_what_a_mixture_entry_s_source_says_about_its_path_names_the_entry(tmp_path):
    """The user set `data.mixture[1].path`; `data.path` is unset in a mixture."""
    import pytest

    from dit_trainer.config import MixtureSource
    from dit_trainer.errors import ConfigError
    from tests.conftest import one_paragraph

    image_folder(tmp_path, [{"file_name": "a.png", "text": "a"}], {"a.png": png_bytes()})
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metadata.jsonl").write_text("\n")
    mixture = [MixtureSource(path=str(tmp_path)), MixtureSource(path=str(tmp_path / "empty"))]
    with pytest.raises(ConfigError) as caught:
        build_dataset(DataConfig(mixture=mixture, resolution=8))
    message = one_paragraph(caught.value, "data.mixture[1].path")
    assert "its metadata.jsonl lists no images" in message and "data.path" not in message


def test_a_mixture_entry_s_missing_caption_column_names_the_entry_s_key(tmp_path):
    """Entries have their own `caption_column` (default `text`): the refusal named `data.caption_column`, whose
    value ('txt' here) the entry does not take, so the fix it gave changed nothing."""
    import pytest

    from dit_trainer.config import MixtureSource
    from dit_trainer.errors import ConfigError
    from tests.conftest import one_paragraph

    pattern = write_shards(tmp_path, [[{"__key__": "a", "png": png_bytes(), "txt": "a"}]])
    mixture = [MixtureSource(source="webdataset", path=pattern)]
    with pytest.raises(ConfigError) as caught:
        build_dataset(DataConfig(mixture=mixture, resolution=8, caption_column="txt"))
    message = one_paragraph(caught.value, "data.mixture[0].caption_column")
    assert "`data.mixture[0].caption_column` is 'text'" in message and "has no caption 'text'" in message
