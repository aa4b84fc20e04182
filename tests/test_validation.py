"""Validation loss: held-out images are never trained on, the number is deterministic per checkpoint and falls as a
run learns, and bad validation settings are refused before anything is built."""

import json
from itertools import islice

import pytest
import torch
from PIL import Image

from dit_trainer.data.precompute import precompute
from dit_trainer.data.split import split_indices
from dit_trainer.diffusion.families import build_noise_schedule
from dit_trainer.errors import ConfigError
from dit_trainer.run_folder import list_checkpoints
from dit_trainer.training.run import build_trainer
from dit_trainer.training.validation import ValidationMonitor

from .conftest import TINY_SHAPES, compose_config, read_metrics, train

VALIDATE = ("validation.every_n_steps=10", "validation.split=0.125", "trainer.log_every=10", "trainer.sample_every=0")


def _validation_monitor(trainer) -> ValidationMonitor:
    return next(monitor for monitor in trainer.monitors if isinstance(monitor, ValidationMonitor))


def _captioned_folder(folder, count: int) -> None:
    """``count`` 32-px images, each with its own caption ``image <i>``, so a caption identifies an image."""
    folder.mkdir()
    with (folder / "metadata.jsonl").open("w") as metadata:
        for i in range(count):
            Image.new("RGB", (32, 32), (i * 6, 255 - i * 6, 128)).save(folder / f"{i}.png")
            metadata.write(json.dumps({"file_name": f"{i}.png", "text": f"image {i}"}) + "\n")


def test_the_split_is_seeded_disjoint_and_complete():
    train_ids, held = split_indices(100, 0.1, seed=3)
    assert (train_ids, held) == split_indices(100, 0.1, seed=3)
    assert held != split_indices(100, 0.1, seed=4)[1]
    assert len(held) == 10 and not set(train_ids) & set(held) and sorted(train_ids + held) == list(range(100))
    assert len(split_indices(10, 0.001, 0)[1]) == 1 and len(split_indices(10, 0.999, 0)[0]) == 1


@pytest.mark.parametrize("overrides", [[], ["diffusion=flow", "diffusion.objective=flow_matching"]])
def test_stratified_timesteps_sit_at_the_centres_of_equal_strata(overrides):
    schedule = build_noise_schedule(compose_config([*TINY_SHAPES, *overrides]).diffusion)
    timesteps = schedule.stratified_timesteps(4, torch.device("cpu"))
    assert timesteps.tolist() == pytest.approx([125, 375, 625, 875], abs=0.5)


@pytest.mark.parametrize("cached", [False, True], ids=["source", "disk_cache"])
def test_held_out_images_are_never_trained_on(tmp_path, cached):
    _captioned_folder(tmp_path / "images", 40)
    overrides = [*TINY_SHAPES, "data=imagefolder", f"data.path={tmp_path / 'images'}", "data.resolution=32",
                 "trainer.batch_size=4", *VALIDATE]  # fmt: skip
    if cached:  # the held-out posteriors come from the cache, and the in-memory latents are the training subset's
        overrides += [f"data.cache_dir={tmp_path / 'cache'}", "data.cache_latents=true"]
        precompute(compose_config(overrides))
    else:
        overrides.append("data.horizontal_flip=true")
    trainer = build_trainer(compose_config(overrides), tmp_path / "run")
    held_out = {caption for batch in _validation_monitor(trainer).batches for caption in batch["caption"]}
    trained = {caption for batch in islice(trainer.batches(), 30) for caption in batch["caption"]}
    assert len(held_out) == 5 and len(trained) == 35  # 3 epochs of 8 full batches reach every training image
    assert not held_out & trained


@pytest.mark.slow
def test_val_loss_falls_and_is_recomputed_bit_identically_from_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    train(run, "trainer.max_steps=40", "trainer.checkpoint_every=20", *VALIDATE)
    logged = {record["step"]: record for record in read_metrics(run) if "val/loss" in record}
    assert sorted(logged) == [10, 20, 30, 40]
    assert logged[40]["val/loss"] < logged[10]["val/loss"]
    strata = [key for key in logged[40] if key.startswith("val/loss/t_")]
    assert len(strata) == 8 and logged[40]["val/seconds"] > 0
    assert logged[40]["val/loss"] == pytest.approx(sum(logged[40][key] for key in strata) / 8)

    checkpoint = next(path for path in list_checkpoints(run / "checkpoints") if path.name.endswith("20"))
    cfg = compose_config([*TINY_SHAPES, "trainer.max_steps=40", *VALIDATE, f"trainer.resume={checkpoint}"])
    trainer = build_trainer(cfg, run)
    recomputed = _validation_monitor(trainer)(trainer.dit, 20)
    assert recomputed["val/loss"] == logged[20]["val/loss"]  # bit-identical, not approximately
    assert all(recomputed[key] == logged[20][key] for key in strata)


@pytest.mark.parametrize(
    ("overrides", "key", "needle"),
    [
        (["validation.split=0.1", "validation.path=/somewhere"], "validation.split", "exactly one place"),
        (["validation.split=0"], "validation.split", "exactly one place"),
        (["data=webdataset", "data.path='/shards/{0..1}.tar'", "validation.split=0.1"], "validation.split", "streamed"),
        (
            ["data=imagefolder", "data.path=IMAGES", "validation.split=0", "validation.path=/nowhere"],
            "validation.path",
            "metadata.jsonl",
        ),
        (["validation.split=0.1", "validation.timesteps=2000"], "validation.timesteps", "only 1000"),
    ],
)
def test_bad_validation_settings_are_refused_naming_the_key(tmp_path, overrides, key, needle):
    _captioned_folder(tmp_path / "images", 2)
    overrides = [item.replace("IMAGES", str(tmp_path / "images")) for item in overrides]
    with pytest.raises(ConfigError) as caught:
        compose_config([*TINY_SHAPES, "validation.every_n_steps=10", *overrides])
    assert caught.value.key == key and needle in str(caught.value)
