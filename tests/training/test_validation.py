"""Validation loss (``training/validation.py``): held-out images are never trained on, whether they come from the
source or from the disk cache."""

from itertools import islice

import pytest

from dit_trainer.data.precompute import precompute
from dit_trainer.training.run import build_trainer

from ..conftest import TINY_SHAPES, VALIDATE, compose_config, validation_monitor
from ..data.files import captioned_folder


@pytest.mark.parametrize("cached", [False, True], ids=["source", "disk_cache"])
def test_held_out_images_are_never_trained_on(tmp_path, cached):
    captioned_folder(tmp_path / "images", 40)
    # No loader workers: this trainer never finishes `fit`, and its persistent workers would hold the interpreter's
    # exit for ~20 s each.
    overrides = [*TINY_SHAPES, "data=imagefolder", f"data.path={tmp_path / 'images'}", "data.resolution=32",
                 "data.num_workers=0", "trainer.batch_size=4", *VALIDATE]  # fmt: skip
    if cached:  # the held-out posteriors come from the cache, and the in-memory latents are the training subset's
        overrides += [f"data.cache_dir={tmp_path / 'cache'}", "data.cache_latents=true"]
        precompute(compose_config(overrides))
    else:
        overrides.append("data.horizontal_flip=true")
    trainer = build_trainer(compose_config(overrides), tmp_path / "run")
    held_out = {caption for batch in validation_monitor(trainer).batches for caption in batch["caption"]}
    trained = {caption for batch in islice(trainer.batches(), 30) for caption in batch["caption"]}
    assert len(held_out) == 5 and len(trained) == 35  # 3 epochs of 8 full batches reach every training image
    assert not held_out & trained
