"""Exports that are pipelines: the default shapes run (PixArt, the shipped VAE, MiniLM) exports a folder that
``DiffusionPipeline.from_pretrained`` loads from anywhere and that generates with ``pipe(prompt)`` at the trained size
what our sampler does; every file and folder has the modes the user's umask gives (the team can read them); and a
LoRA run's export holds the adapter alone, which the base model's ``pipe.load_lora_weights`` reads."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from diffusers import DiffusionPipeline, PixArtAlphaPipeline, SanaPipeline
from safetensors import safe_open

from dit_trainer.apps.export import MANIFEST, export_run
from dit_trainer.apps.inference import load_run
from dit_trainer.config import ExportConfig

from ..conftest import QUICK, REPO
from ..tiny_sana import sana_overrides, write_sana_folder
from . import family_runs

PROMPTS, SEEDS = ["a red circle", "a blue square"], [3, 4]


@pytest.fixture(scope="module")
def shapes_export(tmp_path_factory) -> Path:
    """A 2-step run of the default shapes configuration and its export, both written under umask 022."""
    root = tmp_path_factory.mktemp("shapes_export")
    old = os.umask(0o022)
    try:
        family_runs.train_in_process(root / "run", *QUICK)
        export_run(ExportConfig(run_dir=str(root / "run")))
    finally:
        os.umask(old)
    return root / "run" / "export" / "checkpoint-2"


@pytest.mark.slow
def test_the_default_export_loads_as_a_diffusers_pipeline_anywhere_and_generates_what_our_sampler_does(
    shapes_export, tmp_path
):
    index = json.loads((shapes_export / "model_index.json").read_text())
    assert index["_class_name"] == "PixArtAlphaPipeline" and index["text_encoder"] == ["transformers", "BertModel"]
    manifest = json.loads((shapes_export / MANIFEST).read_text())
    # The one argument the pipeline needs at 32 px: its resolution binning knows only PixArt's own sizes. Height and
    # width default to the trained size.
    assert manifest["required"] == {"use_resolution_binning": False}
    summary = json.loads((shapes_export.parents[1] / "summary.json").read_text())
    assert summary["exports"] == ["export/checkpoint-2"]  # the run's summary knows its export
    texts = [path.read_text() for path in shapes_export.rglob("*.json")]
    for absolute in (str(REPO), str(shapes_export.parents[2]), "site-packages"):  # the venv, the run, the repo
        assert not any(absolute in text for text in texts), absolute

    moved = shutil.copytree(shapes_export, tmp_path / "moved")  # a copy elsewhere, without its run
    pipe = DiffusionPipeline.from_pretrained(moved)
    assert isinstance(pipe, PixArtAlphaPipeline) and type(pipe.text_encoder).__name__ == "BertModel"
    with pytest.raises(ValueError, match="Invalid sample size"):  # why `required` names the binning
        pipe("a red circle", num_inference_steps=1)

    # `pipe(prompt)` with the required argument, the run's steps and guidance and otherwise the pipeline's defaults
    # (120 tokens where our sampler encodes 8: the padding is masked) generates at the trained size what our sampler
    # does from the same noise.
    run = load_run(shapes_export.parents[1], device="cpu")
    ours = run.generate_images(PROMPTS, SEEDS, run.settings(2, 3.0))
    noise = family_runs.seeded_noise(run.text_to_image.latent_shape, SEEDS)
    theirs = pipe(PROMPTS, latents=noise, num_inference_steps=2, guidance_scale=3.0, output_type="pt",
                  **manifest["required"]).images  # fmt: skip
    assert theirs.shape == (2, 3, 32, 32)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_an_export_and_the_run_s_checkpoint_are_readable_by_the_group_under_umask_022(shapes_export):
    checkpoint = shapes_export.parents[1] / "checkpoints" / "checkpoint-2"
    for folder in (shapes_export, checkpoint):
        paths = [folder, *folder.rglob("*")]
        assert any(path.suffix == ".safetensors" for path in paths)  # (safetensors writes 0600)
        modes = {path.relative_to(folder): stat.S_IMODE(path.stat().st_mode) for path in paths}
        wrong = {
            path: oct(mode) for path, mode in modes.items() if mode != (0o755 if (folder / path).is_dir() else 0o644)
        }
        assert not wrong, wrong


@pytest.fixture(scope="module")
def sana_folder(tmp_path_factory) -> Path:
    return write_sana_folder(tmp_path_factory.mktemp("sana"))


@pytest.mark.slow
def test_a_lora_export_holds_the_adapter_that_the_base_pipeline_s_load_lora_weights_reads(sana_folder, tmp_path):
    """Sana's pipeline has a LoRA loader (SD3's and Flux's too; PixArt's and DiT's have none in diffusers 0.42): the
    base model's pipeline with the exported adapter loaded generates what the merged export does."""
    family_runs.train_lora(tmp_path / "lora", sana_folder, *sana_overrides(sana_folder))
    result = export_run(ExportConfig(run_dir=str(tmp_path / "lora"), out_dir=str(tmp_path / "export")))
    entry = result.manifest["lora"]
    assert entry["file"] == "lora/pytorch_lora_weights.safetensors" and entry["base"]["subfolder"] == "transformer"
    assert (result.out_dir / entry["base"]["pretrained"]).resolve() == sana_folder.resolve()
    with safe_open(result.out_dir / entry["file"], "pt") as adapter:
        assert all(key.startswith("transformer.") and ".lora_" in key for key in adapter.keys())  # noqa: SIM118 (not a dict)
        assert json.loads(adapter.metadata()["lora_adapter_metadata"])["transformer.r"] == 4

    call = {
        k: v for k, v in result.manifest["generation"].items() if k not in ("num_inference_steps", "guidance_scale")
    }
    call |= {"latents": family_runs.seeded_noise((8, 8, 8), SEEDS), "num_inference_steps": 2, "output_type": "latent"}
    base = SanaPipeline.from_pretrained(sana_folder)
    before = base(PROMPTS, **call).images
    base.load_lora_weights(result.out_dir / "lora")
    after = base(PROMPTS, **call).images
    merged = SanaPipeline.from_pretrained(result.out_dir)(PROMPTS, **call).images
    assert (after - before).abs().max() > 1e-3  # the adapter changes the output...
    torch.testing.assert_close(after, merged, atol=1e-4, rtol=0)  # ...into the fine-tuned model's
