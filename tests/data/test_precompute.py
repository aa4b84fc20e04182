"""Writing the disk cache (``data/precompute.py``): a folder of other files, or a file, is refused and nothing in it
deleted."""

import pytest

from dit_trainer.data.precompute import precompute
from dit_trainer.errors import ConfigError

from ..conftest import DATA_SMALL, compose_config, digest, one_paragraph


@pytest.mark.parametrize(
    "files",
    [{"shard-000000.tar": b"a webdataset shard", "shard-000001.tar": b"another"},
     {"shard-00000-00000.safetensors": b"left by an unfinished precompute", "notes.txt": b"the user's"}],
    ids=["webdataset-shards", "a-cache-shard-beside-a-user-file"],
)  # fmt: skip
def test_precompute_into_a_folder_of_other_files_is_refused_and_deletes_nothing(tmp_path, files):
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    before = digest(tmp_path)
    with pytest.raises(ConfigError) as caught:
        precompute(compose_config([*DATA_SMALL, f"data.cache_dir={tmp_path}"]))
    assert "not part of a cache" in one_paragraph(caught.value, "data.cache_dir")
    assert digest(tmp_path) == before


def test_a_cache_dir_that_is_a_file_is_refused(tmp_path):
    shard = tmp_path / "shard-000000.tar"
    shard.write_bytes(b"a webdataset shard")
    with pytest.raises(ConfigError) as caught:
        precompute(compose_config([*DATA_SMALL, f"data.cache_dir={shard}"]))
    assert "is a file" in one_paragraph(caught.value, "data.cache_dir")
    assert shard.read_bytes() == b"a webdataset shard"
