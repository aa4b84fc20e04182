"""FLUX.1 end to end, in-process, on a tiny random guidance-distilled Flux pipeline folder (``tests/tiny_flux.py``)
with Flux's resolution-shifted schedule: training on the shapes data, resuming bit for bit, LoRA, GRPO, and an export
that ``FluxPipeline.from_pretrained`` loads and that generates what our sampler does from the same noise (true CFG
and the embedded guidance both on), prompts given as text."""

import json
import shutil

import pytest

from dit_trainer.components.families.flux import pack

from ..conftest import grpo_overrides, read_metrics
from ..tiny_flux import flux_overrides, write_tiny_flux
from . import family_runs

PROMPTS, SEEDS = ["a red circle"], [3]  # FluxPipeline encodes its negative prompt "" once: one prompt a call
# The tiny pipeline folder (`flux_folder`) and 30 steps on it with a copy resumed at step 15 (`flux_runs`).
flux_folder, flux_runs = family_runs.family_fixtures("flux", write_tiny_flux, flux_overrides)


@pytest.mark.slow
def test_flux_trains_and_a_resumed_run_matches_the_uninterrupted_one(flux_runs):
    losses = family_runs.check_resumed_run(flux_runs)
    print(f"flux loss: first 5 steps {sum(losses[:5]) / 5:.3f} -> last 5 {sum(losses[-5:]) / 5:.3f}")
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses
    config = json.loads((flux_runs / "straight" / "checkpoints" / "checkpoint-30" / "transformer" / "config.json")
                        .read_text())  # fmt: skip
    assert config["_class_name"] == "FluxTransformer2DModel" and config["in_channels"] == 64
    assert config["guidance_embeds"] and config["num_single_layers"] == 1 and config["joint_attention_dim"] == 32


@pytest.mark.slow
def test_flux_export_is_a_flux_pipeline_that_reproduces_our_sampler(flux_runs, tmp_path):
    from diffusers import FluxPipeline

    from dit_trainer.apps.inference import load_run

    run_dir, folder = flux_runs / "straight", tmp_path / "export"
    result = family_runs.export(run_dir, folder, "FluxPipeline")
    generation = result.manifest["generation"]
    assert generation == {"height": 16, "width": 16, "num_inference_steps": 4, "guidance_scale": 3.5,
                          "true_cfg_scale": 3.0, "negative_prompt": "", "max_sequence_length": 8}  # fmt: skip
    assert "true_cfg_scale=3.0" in result.usage

    pipe = FluxPipeline.from_pretrained(folder)
    assert pipe.scheduler.config.use_dynamic_shifting and pipe.vae.config.shift_factor == 0.1159
    run = load_run(run_dir, device="cpu")
    ours = run.generate_images(PROMPTS, SEEDS, run.settings(4, 3.0))
    noise = family_runs.seeded_noise(run.text_to_image.latent_shape, SEEDS)
    theirs = pipe(PROMPTS, latents=pack(noise), output_type="pt", **generation).images
    assert theirs.shape == ours.shape == (1, 3, 16, 16)
    difference = (theirs - ours).abs().max().item()
    print(f"max abs difference, FluxPipeline vs our sampler: {difference:.2e}")
    assert difference < 1e-4
    # Without CFG and with another embedded guidance the images change: both settings reach the transformer.
    plain = pipe(PROMPTS, latents=pack(noise), output_type="pt", **(generation | {"true_cfg_scale": 1.0})).images
    other = pipe(PROMPTS, latents=pack(noise), output_type="pt", **(generation | {"guidance_scale": 1.0})).images
    assert (plain - ours).abs().max() > 1e-3 and (other - ours).abs().max() > 1e-3


@pytest.mark.slow
def test_a_minilm_flux_run_exports_pieces_whose_usage_reproduces_our_sampler(tmp_path):
    """With a mean-pooled MiniLM the export holds transformer/, vae/ (the shapes VAE, its statistics folded in) and
    scheduler/; the manifest's usage passes the embeddings our conditioner computes and generates what we do."""
    from dit_trainer.apps.inference import load_run

    run_dir = family_runs.train_in_process(
        tmp_path / "run", "model.family=flux", "diffusion=flow", "diffusion.objective=flow_matching",
        "diffusion.resolution_shift=true", "conditioner.pooling=mean", "model.num_layers=1", "model.patch_size=2",
        "model.num_attention_heads=2", "model.attention_head_dim=8", "+model.extra_config.num_single_layers=1",
        "trainer.max_steps=2", "trainer.sample_every=0",
    )  # fmt: skip
    result = family_runs.export(run_dir, tmp_path / "export", None)
    assert "guidance_scale" not in result.manifest["generation"]  # no guidance embedding: nothing to pass
    run = load_run(run_dir, device="cpu")
    ours = run.generate_images(PROMPTS, SEEDS, run.settings(run.cfg.diffusion.sample_steps, 3.0))
    noise = family_runs.seeded_noise(run.text_to_image.latent_shape, SEEDS)
    usage = result.usage.replace("pipe(prompt_embeds=", "pipe(latents=latents, output_type='pt', prompt_embeds=")
    scope = {"latents": pack(noise)}
    exec(usage, scope)
    difference = (scope["image"][None] - ours).abs().max().item()
    print(f"max abs difference, FluxPipeline from pieces vs our sampler: {difference:.2e}")
    assert difference < 1e-4


@pytest.mark.slow
def test_flux_lora_trains_only_the_adapters(flux_folder, tmp_path):
    run_dir = tmp_path / "lora"
    adapter = family_runs.train_lora(run_dir, flux_folder, *flux_overrides(flux_folder))
    targets = {name.split(".lora_")[0].split("blocks.0.", 1)[-1] for name in adapter}
    assert {"attn.to_q", "attn.add_q_proj", "attn.to_add_out", "ff.net.2", "ff_context.net.2", "proj_mlp"} <= targets


@pytest.mark.slow
def test_flux_grpo_runs_three_epochs(flux_runs, tmp_path):
    init = flux_runs / "straight"
    shutil.rmtree(init / "checkpoints" / "checkpoint-15", ignore_errors=True)  # GRPO starts from the latest
    overrides = grpo_overrides(init, "grpo.group_size=2", "grpo.rollout_batch_size=4", epochs=3)
    run_dir = family_runs.train_in_process(tmp_path / "grpo", *overrides, base=())  # the command line, as train.py
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(-1 <= r["rollout/reward_mean"] <= 1 and r["policy/updates"] == 1 for r in records)
    family_runs.grpo_weights(init, run_dir, 2)
