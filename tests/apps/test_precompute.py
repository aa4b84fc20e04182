"""Writing the disk cache (``apps/precompute.py``): a folder of other files, or a file, is refused and nothing in it
deleted; the sizes index folder that precompute's buckets write there is its own, and kept."""

import pytest

from dit_trainer.data.cache.cache import check_cache_folder
from dit_trainer.data.split import split_validation
from dit_trainer.errors import ConfigError
from tests.conftest import DATA_SMALL, compose_config, digest, one_paragraph, open_cache_of, precompute_cache
from tests.data.files import photos_folder

INDEX = "0123456789abcdef0123456789abcdef.json"  # a sizes index's name: its data's fingerprint digest


@pytest.mark.parametrize(
    "files",
    [{"shard-000000.tar": b"a webdataset shard", "shard-000001.tar": b"another"},
     {"shard-00000-00000.safetensors": b"left by an unfinished precompute", "notes.txt": b"the user's"},
     {f"image_sizes/{INDEX}": b"{}", "image_sizes/notes.txt": b"the user's"},
     {f"image_sizes/{INDEX}": b"{}", f"other/{INDEX}": b"{}"}],
    ids=["webdataset-shards", "a-cache-shard-beside-a-user-file", "a-user-file-among-sizes", "another-folder"],
)  # fmt: skip
def test_precompute_into_a_folder_of_other_files_is_refused_and_deletes_nothing(tmp_path, files):
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    before = digest(tmp_path)
    with pytest.raises(ConfigError) as caught:
        precompute_cache(compose_config([*DATA_SMALL, f"data.cache_dir={tmp_path}"]))
    assert "not part of a cache" in one_paragraph(caught.value, "data.cache_dir")
    assert INDEX not in str(caught.value) and digest(tmp_path) == before  # the sizes index is not among them


def test_a_cache_dir_that_is_a_file_is_refused(tmp_path):
    shard = tmp_path / "shard-000000.tar"
    shard.write_bytes(b"a webdataset shard")
    with pytest.raises(ConfigError) as caught:
        precompute_cache(compose_config([*DATA_SMALL, f"data.cache_dir={shard}"]))
    assert "is a file" in one_paragraph(caught.value, "data.cache_dir")
    assert shard.read_bytes() == b"a webdataset shard"


def test_an_unfinished_precompute_keeps_its_sizes_index_and_only_its_own_files_are_replaced(tmp_path):
    cache, sizes = tmp_path / "cache", tmp_path / "cache" / "image_sizes"
    sizes.mkdir(parents=True)
    (sizes / INDEX).write_text("{}")
    (sizes / f".{INDEX}.partial").write_text("{")  # an index write cut short
    (cache / "shard-00000-00000.safetensors").write_bytes(b"stale")
    assert check_cache_folder(cache) == [cache / "shard-00000-00000.safetensors"]  # the sizes stay
    sizes.rename(tmp_path / "elsewhere")
    sizes.symlink_to(tmp_path / "elsewhere")  # a link would have the index written outside the cache
    with pytest.raises(ConfigError, match=r"not part of a cache \(image_sizes\)"):
        check_cache_folder(cache)


def test_each_unreadable_file_is_reported_once(tmp_path):
    """Two truncated files in a row: the first is tried again as the second's replacement, yet reported once."""
    images = photos_folder(tmp_path / "photos", count=6, bad=2)
    folder = ["data=imagefolder", f"data.path={images}", "vae=pixel", "data.resolution=16", "data.num_workers=0"]
    cfg = compose_config([*DATA_SMALL, *folder, f"data.cache_dir={tmp_path / 'cache'}", "trainer.batch_size=4"])
    result = precompute_cache(cfg)
    assert result.items == 8 and len(result.bad_files) == 2
    assert all(name in " ".join(result.bad_files) for name in ("6.png", "7.png"))
    assert result.message == f"Cache {tmp_path / 'cache'}: encoded 8 items, 2 unreadable files skipped."
    again = precompute_cache(cfg)  # complete: files fixed since would not be encoded again, so it names them
    assert again.items == 0 and again.bad_files == result.bad_files
    assert "already complete; prompts updated. It was encoded with 2 unreadable files skipped (first: " in (
        again.message
    )
    assert "precompute into a new `data.cache_dir`" in again.message


def test_a_folder_of_too_many_unreadable_images_is_refused_before_its_cache_is_complete(tmp_path):
    """Each unreadable image's row would hold a copy of the next readable one, and training from the cache never
    reads a file to notice: precompute holds `data.max_bad_fraction` itself."""
    images = photos_folder(tmp_path / "photos", count=10, bad=6)
    folder = ["data=imagefolder", f"data.path={images}", "vae=pixel", "data.resolution=16", "data.num_workers=0"]
    base = [*DATA_SMALL, *folder, f"data.cache_dir={tmp_path / 'cache'}", "trainer.batch_size=4"]
    with pytest.raises(ConfigError) as caught:
        precompute_cache(compose_config(base))
    message = one_paragraph(caught.value, "data.path")
    assert "10.png" in message and "`data.max_bad_fraction=0.01` allows" in message
    assert not (tmp_path / "cache" / "index.json").exists()  # no cache to train from
    result = precompute_cache(compose_config([*base, "data.max_bad_fraction=0.9"]))
    assert result.items == 16 and len(result.bad_files) == 6


def test_a_stand_in_for_an_unreadable_image_stays_on_its_own_side_of_the_split(tmp_path):
    """Precompute fills an unreadable item's row with the next readable image (here item 0, for items 6 and 7): the
    row must count as that image's, or a held-out split would train on an image it validates with."""
    images = photos_folder(tmp_path / "photos", count=6, bad=2)
    folder = ["data=imagefolder", f"data.path={images}", "vae=pixel", "data.resolution=16", "data.num_workers=0"]
    base = [*DATA_SMALL, *folder, f"data.cache_dir={tmp_path / 'cache'}", "trainer.batch_size=4"]
    precompute_cache(compose_config(base))
    for seed in range(6):
        cfg = compose_config([*base, "validation.every_n_steps=10", "validation.split=0.25", f"validation.seed={seed}"])
        cache, _ = open_cache_of(cfg)
        train, held_out = split_validation(cfg.data, cfg.validation, cache)
        trained = {cache.captions[row] for row in train.indices}
        assert not trained & {cache.captions[row] for row in held_out.indices}, seed


def test_more_workers_than_cpus_are_lowered_as_training_lowers_them(tmp_path, monkeypatch, caplog):
    """Precompute started every configured worker (torch warned it might freeze); training lowers them to this
    process's share of the CPUs, with the project's warning. Here the share is 1 CPU: one per local process."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1024")
    images = photos_folder(tmp_path / "photos", count=8, bad=0)
    folder = ["data=imagefolder", f"data.path={images}", "vae=pixel", "data.resolution=16", "data.num_workers=3"]
    cfg = compose_config([*DATA_SMALL, *folder, f"data.cache_dir={tmp_path / 'cache'}", "trainer.batch_size=4"])
    assert precompute_cache(cfg).items == 8
    assert "`data.num_workers=3` is more than the 1 CPUs this process may use" in caplog.text
