"""The on-disk cache as users make it: ``scripts/precompute.py`` writes it (split over two processes too), training
reads it instead of encoding and matches encoding every batch, and a cache made with other settings is refused."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from dit_trainer.data.cache.cache import INDEX
from dit_trainer.data.cache.cached_prompts import CachedPrompts
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.poisson import collate_poisson, is_empty
from dit_trainer.data.sources.shapes import ShapesDataset
from dit_trainer.diffusion.loss import DiffusionLoss
from dit_trainer.errors import ConfigError

from ..conftest import (
    CACHE,
    CACHE_SHAPES,
    CPU_PROCESSES,
    QUIET,
    accelerate_launch,
    components_of,
    compose_config,
    open_cache_of,
    precompute_cache,
    read_metrics,
    run_here,
    run_script,
    train_here,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache") / "shapes"
    result = run_here(["scripts/precompute.py", *CACHE_SHAPES, f"data.cache_dir={folder}"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "encoded 40 items" in result.stdout
    return folder


@pytest.mark.slow
def test_precompute_writes_sharded_posteriors_and_embeddings(cache_dir):
    index = json.loads((cache_dir / INDEX).read_text())
    assert index["items"] == 40 and [s["items"] for s in index["shards"]] == [16, 16, 8]
    cfg = compose_config([*CACHE_SHAPES, f"data.cache_dir={cache_dir}"])
    parts = components_of(cfg)
    first = load_file(cache_dir / index["shards"][0]["file"])
    images = torch.stack([ShapesDataset(40, 32)[i]["image"] for i in range(16)])
    mean, std = parts.vae.encode_posterior(images)
    embeds, mask, _ = parts.text_encoder.encode([ShapesDataset(40, 32)[i]["caption"] for i in range(16)])
    torch.testing.assert_close(first["latent_mean"], mean)
    torch.testing.assert_close(first["latent_std"], std)
    torch.testing.assert_close(first["text_embeds"], embeds, atol=1e-5, rtol=1e-5)
    assert torch.equal(first["text_mask"].long(), mask)
    assert index["prompts"][0] == "" and set(cfg.trainer.sample_prompts) <= set(index["prompts"])


@pytest.mark.slow
def test_training_from_the_cache_matches_encoding_every_batch(cache_dir, tmp_path):
    common = [*CACHE, "trainer.max_steps=8", *QUIET]
    train_here(tmp_path / "encoded", *common, "data.cache_latents=false")
    train_here(tmp_path / "cached", *common, "data.cache_latents=false", f"data.cache_dir={cache_dir}")
    encoded, cached = ([r["loss"] for r in read_metrics(tmp_path / name)] for name in ("encoded", "cached"))
    assert len(cached) == 8 and cached == pytest.approx(encoded, rel=1e-5)


@pytest.mark.slow
def test_the_in_memory_cache_gathers_whole_batches_which_may_be_empty(cache_dir):
    """One gather per tensor hands the DataLoader its batch; a Poisson draw (DP) that selected nothing stays the
    empty batch rather than an indexing error."""
    dataset, _ = open_cache_of(compose_config([*CACHE_SHAPES, f"data.cache_dir={cache_dir}"]))
    assert dataset.in_memory
    loader = DataLoader(dataset, batch_sampler=[[], [3, 17, 5]], collate_fn=collate_poisson)
    empty, batch = list(loader)
    assert is_empty(empty)
    assert batch["caption"] == [dataset[i]["caption"] for i in (3, 17, 5)] and batch["bad_files"] == []
    for key in ("latent_mean", "latent_std", "text_embeds", "text_mask"):
        assert torch.equal(batch[key], torch.stack([dataset[i][key] for i in (3, 17, 5)]))


@pytest.mark.slow
def test_training_from_the_cache_loads_no_encoder(cache_dir):
    cfg = compose_config([*CACHE_SHAPES, f"data.cache_dir={cache_dir}"])
    dataset, text = open_cache_of(cfg)
    parts = components_of(cfg, cached_text=text)
    assert isinstance(parts.text_encoder, CachedPrompts) and parts.vae.autoencoder.encoder is None
    assert len(dataset) == 40 and dataset.in_memory
    assert parts.vae.decode(torch.zeros(1, *parts.latent_shape)).shape == (1, 3, 32, 32)  # the decoder samples


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "named"),
    [("conditioner.max_length=16", "conditioner.max_length"), ("data.resolution=64", "data.resolution"),
     ("data.cache_dtype=float16", "data.cache_dtype"), ("data.seed=1", "data.seed")],
)  # fmt: skip
def test_a_cache_made_with_other_settings_is_refused(cache_dir, override, named):
    cfg = compose_config([*CACHE_SHAPES, f"data.cache_dir={cache_dir}", override])
    with pytest.raises(ConfigError) as caught:
        open_cache_of(cfg)
    message = str(caught.value)
    assert "`data.cache_dir`" in message and "other settings" in message
    assert named.split(".", 1)[1] in message and "precompute.py" in message


@pytest.mark.slow
def test_new_sample_prompts_are_added_without_reencoding(cache_dir):
    with_prompt = [*CACHE_SHAPES, f"data.cache_dir={cache_dir}", "trainer.sample_prompts=[a tiny green triangle]"]
    with pytest.raises(ConfigError, match="no embedding for the prompts"):
        open_cache_of(compose_config(with_prompt))
    shards = {p.name: p.stat().st_mtime_ns for p in cache_dir.glob("shard-*")}
    assert precompute_cache(compose_config(with_prompt)).items == 0
    _, text = open_cache_of(compose_config(with_prompt))
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

    monkeypatch.setattr("dit_trainer.apps.precompute.save_file", killed_mid_write)
    with_prompt = [*CACHE_SHAPES, f"data.cache_dir={copy}", "trainer.sample_prompts=[a tiny green triangle]"]
    with pytest.raises(KeyboardInterrupt):
        precompute_cache(compose_config(with_prompt))
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.name in before} == before
    _, text = open_cache_of(compose_config([*CACHE_SHAPES, f"data.cache_dir={copy}"]))
    assert text.encode([""])[0].shape == (1, 8, 384)


@pytest.mark.slow
def test_two_processes_split_the_precompute(tmp_path):
    result = run_script([*accelerate_launch(), "scripts/precompute.py", *CACHE_SHAPES, f"data.cache_dir={tmp_path}"],
                        env=CPU_PROCESSES)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    index = json.loads((tmp_path / INDEX).read_text())
    assert [s["file"][:11] for s in index["shards"]] == ["shard-00000", "shard-00000", "shard-00001", "shard-00001"]
    assert index["items"] == 40 and not list(tmp_path.glob("shards-*.json"))


@pytest.mark.slow
def test_a_pooled_condition_is_cached_fingerprinted_and_trains_as_encoding_does(tmp_path):
    """SD3-style conditioning (MiniLM's tokens and its mean-pooled sentence vector): precompute stores the pooled
    vector beside the sequence, the prompt table gives it for caption dropout, and the loss from the cache equals
    the loss of encoding the same items; the pooling is part of the fingerprint."""
    pooled = ["+experiment=shapes_sd3", "model.num_layers=2", "trainer.batch_size=16", *CACHE,
              "monitor.reward.enabled=false", "validation.every_n_steps=0",
              f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    cfg = compose_config(pooled)
    precompute_cache(cfg)
    dataset, text = open_cache_of(cfg)
    assert "text_pooled" in dataset.keys and text.size.pooled == 384
    torch.manual_seed(0)
    cached = components_of(cfg, cached_text=text)
    torch.manual_seed(0)
    live = components_of(compose_config(pooled[:-1]))
    rows = list(range(16))
    from_cache = collate_batch([dataset[i] for i in rows])
    from_images = collate_batch([ShapesDataset(40, 32)[i] for i in rows])
    losses = [
        DiffusionLoss(parts.vae, parts.text_encoder, parts.schedule, caption_dropout=0.5)(
            batch, parts.dit, torch.Generator().manual_seed(3)
        )[0]
        for parts, batch in ((cached, from_cache), (live, from_images))
    ]
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    with pytest.raises(ConfigError, match=r"conditioner\.pooling"):
        open_cache_of(compose_config([*pooled, "conditioner.pooling=pooler"]))
