"""FLUX.2 [klein] end to end, in-process, on a tiny random klein pipeline folder (``tests/tiny_flux2.py``: its Qwen3
conditioner and patched VAE) on FLUX.2's own schedule: training on the shapes data, resuming bit for bit, LoRA, GRPO and
DiffusionNFT from the run, and an export that ``Flux2KleinPipeline.from_pretrained`` loads and that generates what our
sampler does from the same noise (prompts as text, with CFG)."""

import json
import shutil

import pytest

from ..conftest import grpo_overrides, nft_overrides, read_metrics
from ..tiny_flux2 import MAX_LENGTH, flux2_overrides, write_tiny_flux2
from . import family_runs

PROMPTS, SEEDS = ["a red circle"], [3]
# The tiny pipeline folder (`flux2_folder`) and 30 steps on it with a copy resumed at step 15 (`flux2_runs`).
flux2_folder, flux2_runs = family_runs.family_fixtures("flux2", write_tiny_flux2, flux2_overrides)


@pytest.mark.slow
def test_flux2_trains_and_a_resumed_run_matches_the_uninterrupted_one(flux2_runs):
    losses = family_runs.check_resumed_run(flux2_runs)
    print(f"flux2 loss: first 5 steps {sum(losses[:5]) / 5:.3f} -> last 5 {sum(losses[-5:]) / 5:.3f}")
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses
    checkpoint = flux2_runs / "straight" / "checkpoints" / "checkpoint-30"
    config = json.loads((checkpoint / "transformer" / "config.json").read_text())
    assert config["_class_name"] == "Flux2Transformer2DModel" and config["joint_attention_dim"] == 24
    assert config["in_channels"] == 16 and config["patch_size"] == 1 and config["num_single_layers"] == 1


@pytest.mark.slow
def test_flux2_export_is_a_klein_pipeline_that_reproduces_our_sampler(flux2_runs, tmp_path):
    from diffusers import Flux2KleinPipeline

    from dit_trainer.apps.inference import load_run

    run_dir, folder = flux2_runs / "straight", tmp_path / "export"
    result = family_runs.export(run_dir, folder, "Flux2KleinPipeline")
    generation = result.manifest["generation"]  # no sigmas: the pipeline computes FLUX.2's mu, as we do
    assert generation == {"height": 16, "width": 16, "num_inference_steps": 4, "guidance_scale": 3.0,
                          "max_sequence_length": MAX_LENGTH}  # fmt: skip
    assert "undoes itself" in result.manifest["latents"]

    pipe = Flux2KleinPipeline.from_pretrained(folder)
    assert pipe.scheduler.config.use_dynamic_shifting
    run = load_run(run_dir, device="cpu")
    ours = run.generate_images(PROMPTS, SEEDS, run.settings(4, 3.0))
    noise = family_runs.seeded_noise(run.text_to_image.latent_shape, SEEDS)
    theirs = pipe(prompt=list(PROMPTS), latents=noise, output_type="pt", **generation).images
    assert theirs.shape == ours.shape == (1, 3, 16, 16)
    difference = (theirs - ours).abs().max().item()
    print(f"max abs difference, Flux2KleinPipeline vs our sampler (CFG 3): {difference:.2e}")
    assert difference < 1e-4
    plain = pipe(prompt=list(PROMPTS), latents=noise, output_type="pt", **(generation | {"guidance_scale": 1.0}))
    assert (plain.images - ours).abs().max() > 1e-3  # the guidance reaches the transformer


@pytest.mark.slow
def test_flux2_lora_trains_only_the_adapters(flux2_folder, tmp_path):
    adapter = family_runs.train_lora(tmp_path / "lora", flux2_folder, *flux2_overrides(flux2_folder))
    lists = ("transformer_blocks", "single_transformer_blocks")  # both block lists are adapted
    assert {name.split(".0.", 1)[0].removeprefix("base_model.model.") for name in adapter} == set(lists)
    targets = {name.split(".lora_")[0].split(".0.", 1)[-1] for name in adapter}
    assert {"attn.to_q", "attn.to_add_out", "ff.linear_in", "ff_context.linear_out", "attn.to_qkv_mlp_proj"} <= targets
    assert any(name.startswith("single_transformer_blocks.0.attn.to_out.lora_") for name in adapter)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["grpo", "nft"])
def test_every_online_method_fine_tunes_a_flux2_run(flux2_runs, tmp_path, method):
    init = flux2_runs / "straight"
    shutil.rmtree(init / "checkpoints" / "checkpoint-15", ignore_errors=True)  # the methods start from the latest
    if method == "grpo":
        overrides = grpo_overrides(init, "grpo.group_size=2", "grpo.rollout_batch_size=4", epochs=4)
    else:
        overrides = nft_overrides(init, "nft.group_size=2", "nft.rollout_batch_size=4", epochs=4)
    run_dir = family_runs.train_in_process(tmp_path / method, *overrides, base=())  # the command line, as train.py
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(-1 <= r["rollout/reward_mean"] <= 1 for r in records)
    family_runs.grpo_weights(init, run_dir, 4)
