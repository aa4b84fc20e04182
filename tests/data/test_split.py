"""The validation split (``data/split.py``): seeded, disjoint and complete."""

import pytest

from dit_trainer.config import DataConfig, ValidationConfig
from dit_trainer.data.sources.source import build_dataset
from dit_trainer.data.split import split_indices, split_validation
from dit_trainer.errors import ConfigError
from tests.conftest import one_paragraph

from .files import image_folder, png_bytes, write_shards


def test_the_split_is_seeded_disjoint_and_complete():
    train_ids, held = split_indices(100, 0.1, seed=3)
    assert (train_ids, held) == split_indices(100, 0.1, seed=3)
    assert held != split_indices(100, 0.1, seed=4)[1]
    assert len(held) == 10 and not set(train_ids) & set(held) and sorted(train_ids + held) == list(range(100))
    assert len(split_indices(10, 0.001, 0)[1]) == 1 and len(split_indices(10, 0.999, 0)[0]) == 1


def test_a_data_set_of_one_image_cannot_be_split_and_is_refused_before_training(tmp_path):
    """Nothing would be held out, and the first validation would fail on an empty set, after training began."""
    folder = image_folder(tmp_path, [{"file_name": "0.png", "text": "one"}], {"0.png": png_bytes()})
    data = DataConfig(source="imagefolder", path=str(folder), resolution=8)
    with pytest.raises(ConfigError) as refused:
        split_validation(data, ValidationConfig(every_n_steps=2, split=0.5), build_dataset(data))
    message = one_paragraph(refused.value, "validation.split")
    assert "the data set holds 1 item(s)" in message and "`validation.every_n_steps=0`" in message


def test_webdataset_validation_shards_are_read_whole_by_the_main_process_of_several(tmp_path, monkeypatch):
    """Validation runs on the main process alone, so it reads every validation shard, not the main process's
    share of them."""
    monkeypatch.setattr("dit_trainer.data.sources.webdataset.process_rank_and_world_size", lambda: (0, 2))
    (tmp_path / "val").mkdir()
    shards = [[{"__key__": f"s{s}_{i}", "png": png_bytes(), "txt": f"s{s}_{i}"} for i in range(3)] for s in range(4)]
    pattern = write_shards(tmp_path / "val", shards)
    data = DataConfig(source="webdataset", path=pattern, resolution=8, caption_column="txt", shuffle_buffer=0)
    _, held_out = split_validation(data, ValidationConfig(every_n_steps=10, path=pattern), None)
    assert sorted(item["caption"] for item in held_out) == sorted(sample["txt"] for shard in shards for sample in shard)
