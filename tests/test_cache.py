"""The on-disk cache: scripts/precompute.py writes it, training reads it instead of encoding, and refuses a cache
made with other settings."""

import json
import shutil
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from dit_trainer.components.build import build_components
from dit_trainer.data.cache import INDEX, CachedPrompts, open_cache, save_shard
from dit_trainer.data.poisson import collate_poisson, is_empty
from dit_trainer.data.precompute import precompute
from dit_trainer.data.shapes import ShapesDataset
from dit_trainer.errors import ConfigError

from .conftest import TINY_SHAPES, compose_config, read_metrics, run_script, train

CPU = torch.device("cpu")
CACHE = ["data.length=40", "data.cache_dtype=float32", "data.cache_shard_size=16"]
SMALL = [*TINY_SHAPES, *CACHE]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache") / "shapes"
    result = run_script(["scripts/precompute.py", *SMALL, f"data.cache_dir={folder}"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "encoded 40 items" in result.stdout
    return folder


@pytest.mark.slow
def test_precompute_writes_sharded_posteriors_and_embeddings(cache_dir):
    index = json.loads((cache_dir / INDEX).read_text())
    assert index["items"] == 40 and [s["items"] for s in index["shards"]] == [16, 16, 8]
    cfg = compose_config([*SMALL, f"data.cache_dir={cache_dir}"])
    parts = build_components(cfg, CPU, torch.float32)
    first = load_file(cache_dir / index["shards"][0]["file"])
    images = torch.stack([ShapesDataset(40, 32)[i]["image"] for i in range(16)])
    mean, std = parts.vae.encode_posterior(images)
    embeds, mask = parts.text_encoder.encode([ShapesDataset(40, 32)[i]["caption"] for i in range(16)])
    torch.testing.assert_close(first["latent_mean"], mean)
    torch.testing.assert_close(first["latent_std"], std)
    torch.testing.assert_close(first["text_embeds"], embeds, atol=1e-5, rtol=1e-5)
    assert torch.equal(first["text_mask"].long(), mask)
    assert index["prompts"][0] == "" and set(cfg.trainer.sample_prompts) <= set(index["prompts"])


@pytest.mark.slow
def test_training_from_the_cache_matches_encoding_every_batch(cache_dir, tmp_path):
    common = [*CACHE, "trainer.max_steps=8", "trainer.log_every=1", "trainer.sample_every=0"]
    train(tmp_path / "encoded", *common, "data.cache_latents=false")
    train(tmp_path / "cached", *common, "data.cache_latents=false", f"data.cache_dir={cache_dir}")
    encoded, cached = ([r["loss"] for r in read_metrics(tmp_path / name)] for name in ("encoded", "cached"))
    assert len(cached) == 8 and cached == pytest.approx(encoded, rel=1e-5)


@pytest.mark.slow
def test_the_in_memory_cache_gathers_whole_batches_which_may_be_empty(cache_dir):
    """One gather per tensor hands the DataLoader its batch; a Poisson draw (DP) that selected nothing stays the
    empty batch rather than an indexing error."""
    dataset, _ = open_cache(compose_config([*SMALL, f"data.cache_dir={cache_dir}"]), CPU)
    assert dataset.in_memory
    loader = DataLoader(dataset, batch_sampler=[[], [3, 17, 5]], collate_fn=collate_poisson)
    empty, batch = list(loader)
    assert is_empty(empty)
    assert batch["caption"] == [dataset[i]["caption"] for i in (3, 17, 5)] and batch["bad_files"] == []
    for key in ("latent_mean", "latent_std", "text_embeds", "text_mask"):
        assert torch.equal(batch[key], torch.stack([dataset[i][key] for i in (3, 17, 5)]))


@pytest.mark.slow
def test_training_from_the_cache_loads_no_encoder(cache_dir):
    cfg = compose_config([*SMALL, f"data.cache_dir={cache_dir}"])
    dataset, text = open_cache(cfg, CPU)
    parts = build_components(cfg, CPU, torch.float32, text)
    assert isinstance(parts.text_encoder, CachedPrompts) and parts.vae.autoencoder.encoder is None
    assert len(dataset) == 40 and dataset.in_memory
    assert parts.vae.decode(torch.zeros(1, *parts.latent_shape)).shape == (1, 3, 32, 32)  # the decoder samples


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "named"),
    [("text_encoder.max_length=16", "text_encoder.max_length"), ("data.resolution=64", "data.resolution"),
     ("data.cache_dtype=float16", "data.cache_dtype"), ("data.seed=1", "data.seed")],
)  # fmt: skip
def test_a_cache_made_with_other_settings_is_refused(cache_dir, override, named):
    cfg = compose_config([*SMALL, f"data.cache_dir={cache_dir}", override])
    with pytest.raises(ConfigError) as caught:
        open_cache(cfg, CPU)
    message = str(caught.value)
    assert "`data.cache_dir`" in message and "other settings" in message
    assert named.split(".", 1)[1] in message and "precompute.py" in message


@pytest.mark.slow
def test_new_sample_prompts_are_added_without_reencoding(cache_dir):
    with_prompt = [*SMALL, f"data.cache_dir={cache_dir}", "trainer.sample_prompts=[a tiny green triangle]"]
    with pytest.raises(ConfigError, match="no embedding for the prompts"):
        open_cache(compose_config(with_prompt), CPU)
    shards = {p.name: p.stat().st_mtime_ns for p in cache_dir.glob("shard-*")}
    assert precompute(compose_config(with_prompt)).items == 0
    _, text = open_cache(compose_config(with_prompt), CPU)
    assert text.encode(["a tiny green triangle"])[0].shape == (1, 8, 384)
    assert {p.name: p.stat().st_mtime_ns for p in cache_dir.glob("shard-*")} == shards


@pytest.mark.slow
def test_adding_prompts_interrupted_mid_write_leaves_the_cache_intact(cache_dir, tmp_path, monkeypatch):
    """A precompute killed while it rewrites the prompt embeddings (here: half a file written, then an interrupt)
    must not corrupt a cache that training can use: the files are replaced only once written whole."""
    copy = shutil.copytree(cache_dir, tmp_path / "cache")
    before = {p.name: p.read_bytes() for p in copy.iterdir()}

    def killed_mid_write(tensors, path, metadata=None):
        Path(path).write_bytes(b"\x00" * 100)
        raise KeyboardInterrupt

    monkeypatch.setattr("dit_trainer.data.precompute.save_file", killed_mid_write)
    with_prompt = [*SMALL, f"data.cache_dir={copy}", "trainer.sample_prompts=[a tiny green triangle]"]
    with pytest.raises(KeyboardInterrupt):
        precompute(compose_config(with_prompt))
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.name in before} == before
    _, text = open_cache(compose_config([*SMALL, f"data.cache_dir={copy}"]), CPU)
    assert text.encode([""])[0].shape == (1, 8, 384)


def test_an_incomplete_cache_and_random_augmentation_are_refused(tmp_path):
    (tmp_path / "shard-00000-00000.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="no complete cache there"):
        open_cache(compose_config([*SMALL, f"data.cache_dir={tmp_path}"]), CPU)
    with pytest.raises(ConfigError, match="`data.horizontal_flip`.*drawn once and frozen"):
        precompute(compose_config([*SMALL, f"data.cache_dir={tmp_path}", "data.horizontal_flip=true"]))


@pytest.mark.parametrize(("value", "dtype"), [(float("nan"), torch.float32), (1e6, torch.float16)])
def test_non_finite_values_are_refused_at_write_time(tmp_path, value, dtype):
    tensors = {"latent_mean": torch.zeros(3, 4, 2, 2), "text_mask": torch.ones(3, 8)}
    tensors["latent_mean"][1, 0, 0, 0] = value
    with pytest.raises(ConfigError, match="latent_mean is NaN/inf for 1 items.*'b'"):
        save_shard(tmp_path / "shard.safetensors", tensors, ["a", "b", "c"], dtype)
    assert not (tmp_path / "shard.safetensors").exists()


@pytest.mark.slow
def test_two_processes_split_the_precompute(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port)]  # fmt: skip
    result = run_script([*launch, "scripts/precompute.py", *SMALL, f"data.cache_dir={tmp_path}"],
                        env={"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    index = json.loads((tmp_path / INDEX).read_text())
    assert [s["file"][:11] for s in index["shards"]] == ["shard-00000", "shard-00000", "shard-00001", "shard-00001"]
    assert index["items"] == 40 and not list(tmp_path.glob("shards-*.json"))


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
    precompute(_folder_config(images, cache))
    return images, cache


def test_a_grown_image_folder_refuses_its_stale_cache(folder_cache):
    images, cache = folder_cache
    dataset, _ = open_cache(_folder_config(images, cache), CPU)
    assert len(dataset) == 4
    _image_folder(images, 5)  # one more image and metadata line
    with pytest.raises(ConfigError) as caught:
        open_cache(_folder_config(images, cache), CPU)
    message = str(caught.value)
    assert "`data.cache_dir`" in message and "entries: cache 4, config 5" in message and "precompute.py" in message


def test_a_cache_made_with_another_tokenizer_subfolder_is_refused(folder_cache):
    images, cache = folder_cache
    with pytest.raises(ConfigError, match="tokenizer_subfolder: cache None, config 'tokenizer'"):
        open_cache(_folder_config(images, cache, "text_encoder.tokenizer_subfolder=tokenizer"), CPU)


def test_a_cache_of_an_older_format_says_to_write_it_again(folder_cache):
    images, cache = folder_cache
    index = json.loads((cache / INDEX).read_text())
    index["fingerprint"]["format"] = 1
    (cache / INDEX).write_text(json.dumps(index))
    with pytest.raises(ConfigError) as caught:
        open_cache(_folder_config(images, cache), CPU)
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
        open_cache(_folder_config(images, cache), CPU)
    message = str(caught.value)
    assert "`data.cache_dir`" in message and "damaged" in message and "\n" not in message


def test_what_an_unfinished_precompute_left_is_replaced(folder_cache):
    """Only files with the cache's own names are removed (here: a shard, a shard list, a half-written index)."""
    images, cache = folder_cache
    (cache / INDEX).unlink()
    (cache / "shards-00000.json").write_text("{}")
    (cache / ".index.json.partial").write_text("{")
    (cache / "shard-00003-00007.safetensors").write_bytes(b"stale")
    assert precompute(_folder_config(images, cache)).items == 4
    assert sorted(p.name for p in cache.iterdir()) == [INDEX, "prompts.safetensors", "shard-00000-00000.safetensors"]


def test_source_content_is_part_of_the_fingerprint(tmp_path):
    """Cheap to compute (no image is read): the metadata of an image folder, the shard sizes of a webdataset, the
    fingerprint `datasets` keeps for a saved data set."""
    import datasets

    from dit_trainer.config import DataConfig, TrainConfig
    from dit_trainer.data.cache import cache_fingerprint

    def fingerprint(source: str, path: str) -> dict:
        return cache_fingerprint(TrainConfig(data=DataConfig(source=source, path=path)))["data_content"]

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
    assert "data_content" not in cache_fingerprint(TrainConfig())  # shapes: its config is its content


class NonFiniteVAE:
    """Encodes like the pixel VAE, but the second image of each batch overflows."""

    def encode_posterior(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = images.float().clone()
        mean[1] = float("inf")
        return mean, torch.zeros_like(mean)


def test_the_in_memory_latent_cache_refuses_non_finite_latents():
    from dit_trainer.data.latent_cache import encode_dataset

    with pytest.raises(ConfigError) as caught:
        encode_dataset(ShapesDataset(4, 8), NonFiniteVAE(), CPU, batch_size=2, show_progress=False)
    message = str(caught.value)
    assert "`data.cache_latents`" in message and "latent_mean is NaN/inf for 1 items" in message
    assert "'a green circle'" in message and "\n" not in message
