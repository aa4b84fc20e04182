"""The model card every export carries (``model_card.py``) and ``push_to_hub`` (``hub_push.py``): the card of a
tiny export read back with ``huggingface_hub``, and the upload refused, before anything is exported, offline or
without a token."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import ModelCard

from dit_trainer.apps.cli import run_cli
from dit_trainer.apps.hub_push import check_hub_push, export_and_push, push_folder
from dit_trainer.apps.model_card import card_metadata
from dit_trainer.config import ExportConfig, LoRAConfig, ModelConfig, TrainConfig
from dit_trainer.errors import ConfigError
from dit_trainer.images import image_grid
from dit_trainer.run_config import read_run_config
from tests.conftest import one_paragraph


def _export(run_dir, out_dir, *args: str) -> int:
    argv = [str(run_dir), f"out_dir={out_dir}", f"checkpoint={run_dir / 'checkpoints' / 'checkpoint-1'}", *args]
    return run_cli(export_and_push, ExportConfig, argv, "usage: export.py")


def test_an_export_carries_a_card_saying_what_was_trained_and_how(written_run, tiny_pixart_dir, tmp_path):
    """``written_run`` (the tiny PixArt as checkpoint-1 of the TINY_SHAPES config), as if written by 2 processes
    and with a sample grid at step 1."""
    checkpoint = written_run / "checkpoints" / "checkpoint-1"
    (checkpoint / "manifest.json").write_text(json.dumps({"files": {}, "world_size": 2, "launch": "ddp"}))
    (written_run / "samples").mkdir()
    grid = written_run / "samples" / "step_0000001.png"
    image_grid(torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)), 2).save(grid)
    out = tmp_path / "export"
    assert _export(written_run, out) == 0

    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "diffusers" and card.data.pipeline_tag == "text-to-image"
    assert {"dit-trainer", "pixart_alpha", "text-to-image"} <= set(card.data.tags) and "lora" not in card.data.tags
    assert card.data.base_model is None  # trained from scratch
    text = card.text
    parameters = sum(tensor.numel() for tensor in _tiny_pixart(tiny_pixart_dir).parameters())
    assert f"{parameters / 1e6:.2f} M parameters, num_layers 2" in text
    cfg = read_run_config(written_run)
    assert "| Trained | all weights, from scratch |" in text and f"| Steps | 1 of {cfg.trainer.max_steps} |" in text
    assert f"`{cfg.diffusion.objective}`" in text and f"`adamw`, lr {cfg.optim.lr:g}" in text
    assert "16 per process x 2 processes x 1 accumulation = 32 images per step" in text
    assert "`assets/shapes_vae` (a local folder)" in text  # the shipped VAE, by its folder's name only
    assert (out / "samples.png").read_bytes() == grid.read_bytes() and "![Samples](samples.png)" in text
    assert "from_pretrained('.'" in text
    assert str(tmp_path) not in text and "site-packages" not in text  # no path of this machine


def _tiny_pixart(folder):
    from diffusers import PixArtTransformer2DModel

    return PixArtTransformer2DModel.from_pretrained(folder)


def test_the_card_metadata_names_a_hub_base_model_and_lora():
    cfg = TrainConfig(model=ModelConfig(pretrained="PixArt-alpha/PixArt-XL-2-512x512"), lora=LoRAConfig(enabled=True))
    data = card_metadata(cfg)
    assert data.base_model == "PixArt-alpha/PixArt-XL-2-512x512" and "lora" in data.tags
    assert card_metadata(TrainConfig(model=ModelConfig(pretrained="/models/mine"))).base_model is None


def test_push_to_hub_is_refused_offline_and_without_a_token_before_anything_is_exported(
    written_run, tmp_path, monkeypatch, capsys
):
    with pytest.raises(ConfigError) as error:  # conftest sets HF_HUB_OFFLINE=1
        check_hub_push("someone/tiny")
    message = one_paragraph(error.value, "push_to_hub")
    assert "HF_HUB_OFFLINE=1" in message and "hf upload someone/tiny" in message
    out = tmp_path / "export"
    assert _export(written_run, out, "push_to_hub=someone/tiny") == 2
    assert "HF_HUB_OFFLINE=1" in capsys.readouterr().err and not out.exists()

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with pytest.raises(ConfigError) as error:
        check_hub_push("someone/tiny")
    assert "hf auth login" in one_paragraph(error.value, "push_to_hub")
    assert _export(written_run, out, "push_to_hub=someone/tiny") == 2
    assert "no Hugging Face token" in capsys.readouterr().err and not out.exists()
    assert _export(written_run, out, "push_to_hub=not a repo") == 2 and not out.exists()


def test_a_network_failure_during_the_upload_is_one_paragraph_that_keeps_the_export(tmp_path, monkeypatch):
    """httpx's connection errors are not OSErrors: a refused connection, as a dropped network gives it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "model_index.json").write_text("{}")
    with pytest.raises(ConfigError) as error:
        push_folder(folder, "someone/tiny", private=True)
    message = one_paragraph(error.value, "push_to_hub")
    assert "the upload failed" in message and f"hf upload someone/tiny {folder}" in message
    assert (folder / "model_index.json").read_text() == "{}"


def test_a_clip_runs_card_names_its_frames_and_shows_its_animated_grid(tmp_path):
    """A video export's card had no samples (its grids are GIFs) and described its data as "32 px squares"."""
    from dit_trainer.apps.model_card import sample_grid, what_was_trained
    from tests.conftest import compose_config

    (tmp_path / "samples").mkdir()
    for step in (2, 4, 9):
        (tmp_path / "samples" / f"step_{step:07d}.gif").write_bytes(b"GIF89a")
    assert sample_grid(tmp_path, 5).name == "step_0000004.gif"
    trained = what_was_trained(compose_config(["+experiment=moving_shapes"]), {}, "1 M parameters", 5)
    assert "32 px squares; clips of 4 frames, crop" in trained
