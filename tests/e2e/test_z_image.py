"""Z-Image end to end, in-process, on a tiny random Z-Image pipeline folder (``tests/tiny_z_image.py``: its Qwen3
conditioner and FLUX.1-style VAE) with the resolution-shifted schedule: training on the shapes data, resuming bit for
bit, LoRA, GRPO and DiffusionNFT from the run, and an export that ``ZImagePipeline.from_pretrained`` loads and that
generates what our sampler does from the same noise (prompts as text), or, trained with MiniLM, pieces whose usage
passes our embeddings."""

import json
import shutil

import pytest

from ..conftest import grpo_overrides, nft_overrides, read_metrics
from ..tiny_z_image import write_tiny_z_image, z_image_overrides
from . import family_runs

PROMPTS, SEEDS = ["a red circle"], [3]
# The tiny pipeline folder (`z_image_folder`) and 30 steps on it with a copy resumed at step 15 (`z_image_runs`).
z_image_folder, z_image_runs = family_runs.family_fixtures("z_image", write_tiny_z_image, z_image_overrides)


@pytest.mark.slow
def test_z_image_trains_and_a_resumed_run_matches_the_uninterrupted_one(z_image_runs):
    losses = family_runs.check_resumed_run(z_image_runs)
    print(f"z_image loss: first 5 steps {sum(losses[:5]) / 5:.3f} -> last 5 {sum(losses[-5:]) / 5:.3f}")
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses
    config = json.loads((z_image_runs / "straight" / "checkpoints" / "checkpoint-30" / "transformer" / "config.json")
                        .read_text())  # fmt: skip
    assert config["_class_name"] == "ZImageTransformer2DModel" and config["cap_feat_dim"] == 16
    assert config["in_channels"] == 16 and config["n_refiner_layers"] == 1 and config["all_patch_size"] == [2]


@pytest.mark.slow
def test_z_image_export_is_a_z_image_pipeline_that_reproduces_our_sampler(z_image_runs, tmp_path):
    from diffusers import ZImagePipeline

    from dit_trainer.apps.inference import load_run

    run_dir, folder = z_image_runs / "straight", tmp_path / "export"
    result = family_runs.export(run_dir, folder, "ZImagePipeline")
    generation = result.manifest["generation"]
    assert generation == {"height": 16, "width": 16, "num_inference_steps": 4, "guidance_scale": 2.0,
                          "cfg_normalization": False, "negative_prompt": "", "max_sequence_length": 96}  # fmt: skip
    assert "guidance_scale=2.0" in result.usage  # our CFG scale 3 is the pipeline's 2

    pipe = ZImagePipeline.from_pretrained(folder)
    assert pipe.scheduler.config.use_dynamic_shifting and pipe.vae.config.shift_factor == 0.1159
    run = load_run(run_dir, device="cpu")
    ours = run.generate_images(PROMPTS, SEEDS, run.settings(4, 3.0))
    noise = family_runs.seeded_noise(run.text_to_image.latent_shape, SEEDS)
    theirs = pipe(list(PROMPTS), latents=noise, output_type="pt", **generation).images
    assert theirs.shape == ours.shape == (1, 3, 16, 16)
    difference = (theirs - ours).abs().max().item()
    print(f"max abs difference, ZImagePipeline vs our sampler: {difference:.2e}")
    assert difference < 1e-4
    plain = pipe(list(PROMPTS), latents=noise, output_type="pt", **(generation | {"guidance_scale": 0.0})).images
    assert (plain - ours).abs().max() > 1e-3  # the guidance reaches the transformer


@pytest.mark.slow
def test_a_minilm_z_image_run_exports_pieces_whose_usage_reproduces_our_sampler(tmp_path):
    """With MiniLM the export holds transformer/, vae/ (the shapes VAE, its statistics folded in) and scheduler/;
    the manifest's usage passes each prompt's real tokens as our conditioner computes them, and generates what we
    do."""
    from dit_trainer.apps.inference import load_run

    run_dir = family_runs.train_in_process(
        tmp_path / "run", "model.family=z_image", "diffusion=flow", "diffusion.objective=flow_matching",
        "model.num_layers=1", "model.patch_size=2", "model.num_attention_heads=2", "model.attention_head_dim=16",
        "+model.extra_config.n_refiner_layers=1", "trainer.max_steps=2", "trainer.sample_every=0",
    )  # fmt: skip
    result = family_runs.export(run_dir, tmp_path / "export", None)
    run = load_run(run_dir, device="cpu")
    ours = run.generate_images(PROMPTS, SEEDS, run.settings(run.cfg.diffusion.sample_steps, 3.0))
    noise = family_runs.seeded_noise(run.text_to_image.latent_shape, SEEDS)
    usage = result.usage.replace("pipe(prompt_embeds=", "pipe(latents=latents, output_type='pt', prompt_embeds=")
    scope = {"latents": noise}
    exec(usage, scope)
    difference = (scope["image"][None] - ours).abs().max().item()
    print(f"max abs difference, ZImagePipeline from pieces vs our sampler: {difference:.2e}")
    assert difference < 1e-4


@pytest.mark.slow
def test_z_image_lora_trains_only_the_adapters(z_image_folder, tmp_path):
    run_dir = tmp_path / "lora"
    adapter = family_runs.train_lora(run_dir, z_image_folder, *z_image_overrides(z_image_folder))
    lists = ("noise_refiner", "context_refiner", "layers")  # every block list is adapted
    assert {next(block for block in lists if f"{block}.0." in name) for name in adapter} == set(lists)
    targets = {name.split(".lora_")[0].split(".0.", 1)[-1] for name in adapter}
    assert {"attention.to_q", "attention.to_out.0", "feed_forward.w1", "feed_forward.w3"} <= targets


@pytest.mark.slow
@pytest.mark.parametrize("method", ["grpo", "nft"])
def test_every_online_method_fine_tunes_a_z_image_run(z_image_runs, tmp_path, method):
    init = z_image_runs / "straight"
    shutil.rmtree(init / "checkpoints" / "checkpoint-15", ignore_errors=True)  # the methods start from the latest
    if method == "grpo":
        overrides = grpo_overrides(init, "grpo.group_size=2", "grpo.rollout_batch_size=4", epochs=3)
    else:
        overrides = nft_overrides(init, "nft.group_size=2", "nft.rollout_batch_size=4", epochs=3)
    run_dir = family_runs.train_in_process(tmp_path / method, *overrides, base=())  # the command line, as train.py
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(-1 <= r["rollout/reward_mean"] <= 1 for r in records)
    family_runs.grpo_weights(init, run_dir, 2)
