"""The on-disk cache of the frozen encoders' outputs (``data/cache/cache.py``): what it is made of (its fingerprint),
what it refuses (another tokenizer, a grown folder, an older format, damage, non-finite values, a folder that is not
a cache) and what of it is ours to replace."""

import json
from pathlib import Path

import pytest
import torch

from dit_trainer.data.cache.cache import INDEX, save_shard
from dit_trainer.errors import ConfigError
from tests.conftest import (
    CACHE_SHAPES,
    DATA_SMALL,
    TINY_SHAPES,
    compose_config,
    digest,
    one_paragraph,
    open_cache_of,
    precompute_cache,
)

CPU = torch.device("cpu")


def test_an_incomplete_cache_and_random_augmentation_are_refused(tmp_path):
    (tmp_path / "shard-00000-00000.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="no complete cache there"):
        open_cache_of(compose_config([*CACHE_SHAPES, f"data.cache_dir={tmp_path}"]))
    with pytest.raises(ConfigError, match="`data.horizontal_flip`.*drawn once and frozen"):
        precompute_cache(compose_config([*CACHE_SHAPES, f"data.cache_dir={tmp_path}", "data.horizontal_flip=true"]))


@pytest.mark.parametrize(("value", "dtype"), [(float("nan"), torch.float32), (1e6, torch.float16)])
def test_non_finite_values_are_refused_at_write_time(tmp_path, value, dtype):
    tensors = {"latent_mean": torch.zeros(3, 4, 2, 2), "text_mask": torch.ones(3, 8)}
    tensors["latent_mean"][1, 0, 0, 0] = value
    with pytest.raises(ConfigError, match="latent_mean is NaN/inf for 1 items.*'b'"):
        save_shard(tmp_path / "shard.safetensors", tensors, ["a", "b", "c"], [0, 1, 2], dtype)
    assert not (tmp_path / "shard.safetensors").exists()


@pytest.mark.parametrize("index", [b"not json", b'{"version": 3}', b"[1, 2]", b"\xff\xfe{}"])
def test_a_folder_whose_index_json_is_not_a_cache_index_is_refused_and_kept(tmp_path, index):
    (tmp_path / "index.json").write_bytes(index)
    (tmp_path / "shard-000000.tar").write_bytes(b"a webdataset shard")
    before = digest(tmp_path)
    cfg = compose_config([*DATA_SMALL, f"data.cache_dir={tmp_path}"])
    for use in (lambda: open_cache_of(cfg), lambda: precompute_cache(cfg)):
        with pytest.raises(ConfigError) as caught:
            use()
        assert "not written by" in one_paragraph(caught.value, "data.cache_dir")
    assert digest(tmp_path) == before


# --- what the cache is made of, and what is ours to delete (issue 17) ---------------------------------------------


def _image_folder(root: Path, count: int) -> Path:
    from PIL import Image

    root.mkdir(exist_ok=True)
    for i in range(count):
        Image.new("RGB", (16, 16), (20 * i, 100, 50)).save(root / f"{i}.png")
    (root / "metadata.jsonl").write_text("".join(json.dumps({"file_name": f"{i}.png", "text": f"picture {i}"}) + "\n"
                                                 for i in range(count)))  # fmt: skip
    return root


def _folder_config(images: Path, cache: Path, *overrides: str):
    folder = ["data=imagefolder", f"data.path={images}", "vae=pixel", "data.resolution=16", "data.num_workers=0"]
    return compose_config([*TINY_SHAPES, *folder, "data.cache_dtype=float32", f"data.cache_dir={cache}", *overrides])


@pytest.fixture()
def folder_cache(tmp_path) -> tuple[Path, Path]:
    """A cache of a 4-image folder, written in-process: (images, cache)."""
    images, cache = _image_folder(tmp_path / "images", 4), tmp_path / "cache"
    precompute_cache(_folder_config(images, cache))
    return images, cache


def test_a_grown_image_folder_refuses_its_stale_cache(folder_cache):
    images, cache = folder_cache
    dataset, _ = open_cache_of(_folder_config(images, cache))
    assert len(dataset) == 4
    _image_folder(images, 5)  # one more image and metadata line
    with pytest.raises(ConfigError) as caught:
        open_cache_of(_folder_config(images, cache))
    message = str(caught.value)
    assert "`data.cache_dir`" in message and "entries: cache 4, config 5" in message and "precompute.py" in message


def test_a_prompt_the_cache_does_not_hold_is_refused_naming_the_cache(folder_cache):
    images, cache = folder_cache
    with pytest.raises(ConfigError) as caught:
        open_cache_of(_folder_config(images, cache, "trainer.sample_prompts=[a prompt never embedded]"))
    message = str(caught.value)
    assert f"`data.cache_dir` is '{cache}'" in message and "['a prompt never embedded']" in message


def test_a_file_given_as_the_cache_is_refused_as_a_file(folder_cache, tmp_path):
    images, _ = folder_cache
    (tmp_path / "notes.txt").write_text("not a cache")
    with pytest.raises(ConfigError, match=r"`data\.cache_dir` is '.*notes\.txt', but it is a file, not a cache folder"):
        open_cache_of(_folder_config(images, tmp_path / "notes.txt"))


def test_a_cache_made_with_another_tokenizer_subfolder_is_refused(folder_cache):
    images, cache = folder_cache
    with pytest.raises(ConfigError, match="tokenizer_subfolder: cache None, config 'tokenizer'"):
        open_cache_of(_folder_config(images, cache, "conditioner.tokenizer_subfolder=tokenizer"))


def test_a_cache_of_an_older_format_says_to_write_it_again(folder_cache):
    images, cache = folder_cache
    index = json.loads((cache / INDEX).read_text())
    index["fingerprint"]["format"] = 1
    (cache / INDEX).write_text(json.dumps(index))
    with pytest.raises(ConfigError) as caught:
        open_cache_of(_folder_config(images, cache))
    message = str(caught.value)
    assert "written by an older version" in message and "precompute.py" in message and "new folder" in message


@pytest.mark.parametrize("damage", ["missing shard", "truncated shard", "missing prompts"])
def test_a_damaged_cache_is_refused_naming_the_file(folder_cache, damage):
    images, cache = folder_cache
    shard = next(cache.glob("shard-*.safetensors"))
    if damage == "missing shard":
        shard.unlink()
    elif damage == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:50])
    else:
        (cache / "prompts.safetensors").unlink()
    with pytest.raises(ConfigError) as caught:
        open_cache_of(_folder_config(images, cache))
    message = str(caught.value)
    assert "`data.cache_dir`" in message and "damaged" in message and "\n" not in message


def test_what_an_unfinished_precompute_left_is_replaced(folder_cache):
    """Only files with the cache's own names are removed (here: a shard, a shard list, a half-written index)."""
    images, cache = folder_cache
    (cache / INDEX).unlink()
    (cache / "shards-00000.json").write_text("{}")
    (cache / ".index.json.partial").write_text("{")
    (cache / "shard-00003-00007.safetensors").write_bytes(b"stale")
    assert precompute_cache(_folder_config(images, cache)).items == 4
    assert sorted(p.name for p in cache.iterdir()) == [INDEX, "prompts.safetensors", "shard-00000-00000.safetensors"]


def test_source_content_is_part_of_the_fingerprint(tmp_path):
    """Cheap to compute (no image is read): the metadata of an image folder, the shard sizes of a webdataset, the
    fingerprint `datasets` keeps for a saved data set."""
    import datasets

    from dit_trainer.config import ConditionerConfig, DataConfig, VAEConfig
    from dit_trainer.data.cache.fingerprint import cache_fingerprint

    def fingerprint(source: str, path: str) -> dict:
        return cache_fingerprint(DataConfig(source=source, path=path), VAEConfig(), ConditionerConfig(), None)[
            "data_content"
        ]

    (tmp_path / "000000.tar").write_bytes(b"x" * 512)
    pattern = str(tmp_path / "{000000..000000}.tar")
    before = fingerprint("webdataset", pattern)
    (tmp_path / "000000.tar").write_bytes(b"x" * 1024)
    assert fingerprint("webdataset", pattern) != before and fingerprint("webdataset", pattern)["bytes"] == 1024

    datasets.Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(tmp_path / "hf")
    before = fingerprint("hf", str(tmp_path / "hf"))
    assert fingerprint("hf", str(tmp_path / "hf")) == before and before["rows"] == 2
    datasets.Dataset.from_dict({"text": ["a", "b", "c"]}).save_to_disk(tmp_path / "hf2")
    assert fingerprint("hf", str(tmp_path / "hf2")) != before

    images = _image_folder(tmp_path / "images", 2)
    before = fingerprint("imagefolder", str(images))
    assert before["entries"] == 2
    (images / "metadata.jsonl").write_text((images / "metadata.jsonl").read_text().replace("picture 1", "a dog"))
    assert fingerprint("imagefolder", str(images)) != before
    assert "data_content" not in cache_fingerprint(
        DataConfig(), VAEConfig(), ConditionerConfig(), None
    )  # shapes: its config is its content


@pytest.mark.parametrize("in_memory", [True, False])
def test_a_float16_cache_is_held_and_read_as_stored_and_widened_exactly_on_the_device(tmp_path, in_memory, monkeypatch):
    """Half the memory and half the bytes to the GPU: the step widens to float32 there, which is exact."""
    from dit_trainer.data.cache import cache

    monkeypatch.setattr(cache, "IN_MEMORY_BYTES", 1 << 30 if in_memory else 0)
    tensors = {"latent_mean": torch.randn(3, 4, 2, 2), "latent_std": torch.rand(3, 4, 2, 2),
               "text_embeds": torch.randn(3, 5, 8), "text_mask": torch.ones(3, 5, dtype=torch.long)}  # fmt: skip
    save_shard(tmp_path / "shard-00000-00000.safetensors", tensors, ["a", "b", "c"], [0, 1, 2], torch.float16)
    index = {"shards": [{"file": "shard-00000-00000.safetensors", "items": 3}]}
    dataset = cache.CacheDataset(tmp_path, index)
    assert dataset.in_memory == in_memory
    item = dataset[1]
    assert item["latent_mean"].dtype == item["text_embeds"].dtype == torch.float16
    assert item["text_mask"].dtype == torch.long
    assert torch.equal(item["latent_mean"].float(), tensors["latent_mean"][1].half().float())


@pytest.mark.parametrize("in_memory", [True, False])
def test_class_ids_are_stored_in_a_type_that_holds_them(tmp_path, in_memory, monkeypatch):
    """A class-conditional cache's ids (text_embeds) beyond int8's 127 read back as written, not wrapped (300 was read
    as 44); masks still take a byte, and a shard written with int8 ids (below 128) beside it reads the same."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from dit_trainer.data.cache import cache

    monkeypatch.setattr(cache, "IN_MEMORY_BYTES", 1 << 30 if in_memory else 0)
    ids = torch.tensor([3, 127, 128, 300])
    tensors = {"latent_mean": torch.randn(4, 1, 2, 2), "text_embeds": ids,
               "text_mask": torch.ones(4, 1, dtype=torch.long)}  # fmt: skip
    save_shard(tmp_path / "shard-00000-00000.safetensors", tensors, list("abcd"), [0, 1, 2, 3], torch.float32)
    with safe_open(tmp_path / "shard-00000-00000.safetensors", framework="pt") as shard:
        assert shard.get_slice("text_mask").get_dtype() == "I8" and shard.get_slice("text_embeds").get_dtype() == "I16"
    older = {"latent_mean": torch.randn(2, 1, 2, 2), "text_embeds": torch.tensor([5, 9], dtype=torch.int8),
             "text_mask": torch.ones(2, 1, dtype=torch.int8)}  # fmt: skip
    save_file(older, tmp_path / "shard-00000-00001.safetensors", metadata={"captions": '["e", "f"]'})
    index = {"shards": [{"file": f"shard-00000-0000{k}.safetensors", "items": n} for k, n in ((0, 4), (1, 2))]}
    dataset = cache.CacheDataset(tmp_path, index)
    assert dataset.in_memory == in_memory
    assert [dataset[i]["text_embeds"].item() for i in range(6)] == [3, 127, 128, 300, 5, 9]
    assert all(dataset[i]["text_embeds"].dtype == dataset[i]["text_mask"].dtype == torch.long for i in range(6))


def test_a_cache_written_in_an_environment_since_rebuilt_matches_this_ones_text_encoder(folder_cache):
    """The fingerprint records the text encoder's weights by their path in the virtual environment that wrote the
    cache; the same package's weights in a rebuilt one are the same encoder (the cache was refused as another)."""
    images, cache = folder_cache
    index = json.loads((cache / INDEX).read_text())
    encoder = index["fingerprint"]["text_encoder"]
    installed = Path(encoder["pretrained"])
    assert "site-packages" in installed.parts  # the shipped MiniLM, from its package
    at = installed.parts.index("site-packages")
    encoder["pretrained"] = str(Path("/gone/venv", *installed.parts[at:]))
    (cache / INDEX).write_text(json.dumps(index))
    dataset, _ = open_cache_of(_folder_config(images, cache))
    assert len(dataset) == 4


def test_a_cache_that_recorded_a_relative_encoder_path_matches_from_the_same_folder(folder_cache, monkeypatch):
    """Configs now record local model paths absolute; a cache written before, from a command line with a relative
    `conditioner.pretrained`, holds the same encoder read from the folder it was written from (it was refused as
    made with other settings)."""
    images, cache = folder_cache
    index = json.loads((cache / INDEX).read_text())
    encoder = Path(index["fingerprint"]["text_encoder"]["pretrained"])
    index["fingerprint"]["text_encoder"]["pretrained"] = encoder.name
    (cache / INDEX).write_text(json.dumps(index))
    monkeypatch.chdir(encoder.parent)
    dataset, _ = open_cache_of(_folder_config(images, cache))
    assert len(dataset) == 4
