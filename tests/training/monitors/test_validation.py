"""Validation loss (``training/monitors/validation.py``): held-out images are never trained on, whether they come from
the source or from the disk cache."""

from itertools import islice

import pytest

from dit_trainer.assemble import build_trainer
from tests.conftest import TINY_SHAPES, VALIDATE, compose_config, precompute_cache, validation_monitor
from tests.data.files import captioned_folder


@pytest.mark.parametrize("cached", [False, True], ids=["source", "disk_cache"])
def test_held_out_images_are_never_trained_on(tmp_path, cached):
    captioned_folder(tmp_path / "images", 40)
    # No loader workers: this trainer never finishes `fit`, and its persistent workers would hold the interpreter's
    # exit for ~20 s each.
    overrides = [*TINY_SHAPES, "data=imagefolder", f"data.path={tmp_path / 'images'}", "data.resolution=32",
                 "data.num_workers=0", "trainer.batch_size=4", *VALIDATE]  # fmt: skip
    if cached:  # the held-out posteriors come from the cache, and the in-memory latents are the training subset's
        overrides += [f"data.cache_dir={tmp_path / 'cache'}", "data.cache_latents=true"]
        precompute_cache(compose_config(overrides))
    else:
        overrides.append("data.horizontal_flip=true")
    trainer = build_trainer(compose_config(overrides), tmp_path / "run")
    held_out = {caption for batch in validation_monitor(trainer).batches for caption in batch["caption"]}
    trained = {caption for batch in islice(trainer.step.batches(), 30) for caption in batch["caption"]}
    assert len(held_out) == 5 and len(trained) == 35  # 3 epochs of 8 full batches reach every training image
    assert not held_out & trained


def test_held_out_text_embeddings_are_kept_in_the_size_they_were_stored_in(tmp_path):
    """A disk cache's text embeddings are widened to float32 when read; the held-out ones stay in memory for the
    whole run, so they go back to their storage size, exactly (a float32 cache's stay float32)."""
    import json

    import torch

    from dit_trainer.components.vae import PixelVAE
    from dit_trainer.data.cache.cache import INDEX, CacheDataset, save_shard
    from dit_trainer.data.split import SplitSide
    from dit_trainer.training.monitors.validation import encode_held_out

    kept = {}
    for name, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        folder = tmp_path / name
        folder.mkdir()
        tensors = {"latent_mean": torch.randn(6, 3, 8, 8), "latent_std": torch.zeros(6, 3, 8, 8),
                   "text_embeds": torch.randn(6, 5, 12), "text_mask": torch.ones(6, 5, dtype=torch.long)}  # fmt: skip
        save_shard(folder / "shard-00000-00000.safetensors", tensors, [str(i) for i in range(6)], list(range(6)), dtype)
        index = {"fingerprint": {}, "items": 6, "dtype": name, "prompts": [],
                 "shards": [{"file": "shard-00000-00000.safetensors", "items": 6}]}  # fmt: skip
        (folder / INDEX).write_text(json.dumps(index))
        cache = CacheDataset(folder, index)
        (batch,) = encode_held_out(SplitSide(cache, [1, 3, 4]), PixelVAE(), torch.device("cpu"), 4)
        assert torch.equal(batch["text_embeds"].float(), torch.stack([cache[i]["text_embeds"] for i in (1, 3, 4)]))
        kept[name] = batch["text_embeds"].element_size()
    assert kept == {"float16": 2, "bfloat16": 2, "float32": 4}
