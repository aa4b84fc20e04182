"""Sana end to end, in-process, on a tiny random Sana pipeline folder (``tests/tiny_sana.py``): training on the shapes
data, resuming bit for bit, LoRA, GRPO, and an export that ``SanaPipeline.from_pretrained`` loads and that generates
what our sampler does from the same noise, prompts given as text."""

import json
import math

import pytest
import torch

from dit_trainer.diffusion.sampler import generate

from ..conftest import grpo_overrides, read_metrics
from ..tiny_sana import sana_overrides, write_sana_folder
from . import family_runs

PROMPTS, SEEDS = ["a red circle", "A Blue square"], [3, 4]
# The tiny pipeline folder (`sana_folder`) and 30 steps on it with a copy resumed at step 15 (`sana_runs`).
sana_folder, sana_runs = family_runs.family_fixtures("sana", write_sana_folder, sana_overrides)


@pytest.mark.slow
def test_sana_trains_and_a_resumed_run_matches_the_uninterrupted_one(sana_runs):
    losses = family_runs.check_resumed_run(sana_runs)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"Sana loss, mean of steps 1-5 -> 26-30: {first:.4f} -> {last:.4f}")
    assert last < 0.8 * first, losses
    config = json.loads(
        (sana_runs / "straight" / "checkpoints" / "checkpoint-30" / "transformer" / "config.json").read_text()
    )
    assert config["_class_name"] == "SanaTransformer2DModel" and config["caption_channels"] == 16


@pytest.mark.slow
def test_sana_export_is_a_sana_pipeline_that_reproduces_our_sampler(sana_runs, tmp_path):
    from diffusers import SanaPipeline

    from dit_trainer.apps.inference import load_run

    run_dir, folder = sana_runs / "straight", tmp_path / "export"
    result = family_runs.export(run_dir, folder, "SanaPipeline")
    manifest = result.manifest
    assert manifest["latents"].startswith("an AutoencoderDC's latents are only scaled")
    assert manifest["generation"]["complex_human_instruction"] == ["Describe the image.", "User Prompt: "]
    assert "complex_human_instruction=instruction" in result.usage

    vae_config = json.loads((folder / "vae" / "config.json").read_text())
    assert vae_config["_class_name"] == "AutoencoderDC" and "latents_mean" not in vae_config  # nothing to fold
    pipe = SanaPipeline.from_pretrained(folder)
    assert pipe.scheduler.config.shift == 3.0
    run = load_run(run_dir, device="cpu")
    parts, settings = run.text_to_image, run.settings(3, 3.0)
    shape = parts.latent_shape
    ours = generate(run.dit, parts.schedule, parts.text_encoder, PROMPTS, SEEDS, shape, settings, parts.device)
    noise = family_runs.seeded_noise(shape, SEEDS)
    generation = {k: v for k, v in manifest["generation"].items() if k not in ("num_inference_steps", "guidance_scale")}
    call = {"latents": noise, "num_inference_steps": 3, "guidance_scale": 3.0, **generation}
    theirs = pipe(PROMPTS, output_type="latent", **call).images
    difference = (theirs - ours).abs().max().item()
    print(f"max abs difference of the latents, SanaPipeline vs our sampler: {difference:.2e}")
    assert theirs.shape == ours.shape == (2, 8, 8, 8) and difference < 1e-4
    assert (ours - noise).abs().max() > 0.1  # the sampler moved them
    images = pipe(PROMPTS, output_type="pt", **call).images
    torch.testing.assert_close(images, run.generate_images(PROMPTS, SEEDS, settings), atol=1e-4, rtol=0)
    # The exported VAE is the run's: SanaPipeline's decode(latents / scaling_factor) is our FrozenVAE.decode.
    z = torch.randn(1, *shape, generator=torch.Generator().manual_seed(0))
    decoded = pipe.vae.decode(z / pipe.vae.config.scaling_factor).sample.clamp(-1, 1)
    torch.testing.assert_close(decoded, run.text_to_image.vae.decode(z), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_sana_lora_trains_only_the_adapters(sana_folder, tmp_path):
    run_dir = tmp_path / "lora"
    adapter = family_runs.train_lora(run_dir, sana_folder, *sana_overrides(sana_folder))
    targets = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in adapter}
    assert targets == {"to_q", "to_k", "to_v", "0", "conv_inverted", "conv_point"}, targets


@pytest.mark.slow
def test_sana_grpo_runs_three_epochs(sana_runs, tmp_path):
    init = sana_runs / "straight"
    overrides = grpo_overrides(init, "grpo.group_size=2", "grpo.rollout_batch_size=4", epochs=3)
    run_dir = family_runs.train_in_process(tmp_path / "grpo", *overrides, base=())
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["policy/updates"] == 1 and r["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4) for r in records)
    assert all(math.isfinite(r["rollout/reward_mean"]) and math.isfinite(r["policy/loss"]) for r in records)
    family_runs.grpo_weights(init, run_dir, 3)


@pytest.mark.slow
def test_a_sana_run_with_another_text_encoder_exports_a_sana_pipeline_with_that_encoder(sana_folder, tmp_path):
    """With MiniLM (the shapes default) the folder is a SanaPipeline holding MiniLM: SanaPipeline's encode_prompt
    calls it as it calls Gemma-2 when no instruction is put before the prompt (the manifest's `required`)."""
    from diffusers import DiffusionPipeline

    from dit_trainer.apps.inference import load_run

    overrides = [o for o in sana_overrides(sana_folder) if not o.startswith("conditioner.")]
    run_dir = family_runs.train_in_process(
        tmp_path / "minilm", *overrides, *family_runs.COMMON, "trainer.max_steps=2", "trainer.checkpoint_every=2"
    )
    result = family_runs.export(run_dir, tmp_path / "export", "SanaPipeline")
    required = result.manifest["required"]
    assert required == {"use_resolution_binning": False, "height": 32, "width": 32, "complex_human_instruction": None}
    namespace = {}
    exec(result.usage, namespace)  # the snippet a user pastes: it generates an image
    assert namespace["image"].size == (32, 32)
    pipe = DiffusionPipeline.from_pretrained(result.out_dir)
    assert type(pipe.text_encoder).__name__ == "BertModel"
    run = load_run(run_dir, device="cpu")
    parts, settings = run.text_to_image, run.settings(2, 3.0)
    ours = generate(run.dit, parts.schedule, parts.text_encoder, PROMPTS[:1], SEEDS[:1], parts.latent_shape,
                    settings, parts.device)  # fmt: skip
    noise = family_runs.seeded_noise(parts.latent_shape, SEEDS[:1])
    theirs = pipe(PROMPTS[:1], latents=noise, num_inference_steps=2, guidance_scale=3.0, output_type="latent",
                  **required).images  # fmt: skip
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
