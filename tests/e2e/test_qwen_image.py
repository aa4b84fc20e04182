"""Qwen-Image end to end, in-process, on a tiny random Qwen-Image pipeline folder (``tests/tiny_qwen_image.py``: its
Qwen2.5-VL conditioner and one-frame video VAE) with its resolution-shifted schedule: training on the shapes data,
resuming bit for bit, LoRA, GRPO and DiffusionNFT from the run, and an export that ``QwenImagePipeline.from_pretrained``
loads and that generates what our sampler does from the same noise (prompts as text)."""

import json
import shutil

import pytest

from ..conftest import grpo_overrides, nft_overrides, read_metrics
from ..tiny_qwen_image import MAX_LENGTH, qwen_image_overrides, write_tiny_qwen_image
from . import family_runs

PROMPTS, SEEDS = ["a red circle"], [3]
# The tiny pipeline folder (`qwen_image_folder`) and 30 steps on it with a copy resumed at step 15 (`qwen_image_runs`).
qwen_image_folder, qwen_image_runs = family_runs.family_fixtures(
    "qwen_image", write_tiny_qwen_image, qwen_image_overrides
)


@pytest.mark.slow
def test_qwen_image_trains_and_a_resumed_run_matches_the_uninterrupted_one(qwen_image_runs):
    losses = family_runs.check_resumed_run(qwen_image_runs)
    print(f"qwen_image loss: first 5 steps {sum(losses[:5]) / 5:.3f} -> last 5 {sum(losses[-5:]) / 5:.3f}")
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses
    checkpoint = qwen_image_runs / "straight" / "checkpoints" / "checkpoint-30"
    config = json.loads((checkpoint / "transformer" / "config.json").read_text())
    assert config["_class_name"] == "QwenImageTransformer2DModel" and config["joint_attention_dim"] == 16
    assert config["in_channels"] == 64 and config["out_channels"] == 16 and config["patch_size"] == 2


@pytest.mark.slow
def test_qwen_image_export_is_a_qwen_image_pipeline_that_reproduces_our_sampler(qwen_image_runs, tmp_path):
    """With CFG: our sampler rescales each token's guided prediction as the pipeline does."""
    from diffusers import QwenImagePipeline

    from dit_trainer.apps.inference import load_run
    from dit_trainer.components.families.flux import pack

    run_dir, folder = qwen_image_runs / "straight", tmp_path / "export"
    result = family_runs.export(run_dir, folder, "QwenImagePipeline")
    generation = result.manifest["generation"]
    assert generation == {"height": 16, "width": 16, "num_inference_steps": 4, "true_cfg_scale": 3.0,
                          "max_sequence_length": MAX_LENGTH, "negative_prompt": ""}  # fmt: skip
    assert "undoes itself" in result.manifest["latents"]

    pipe = QwenImagePipeline.from_pretrained(folder)
    config = pipe.scheduler.config
    assert config.use_dynamic_shifting and config.max_image_seq_len == 8192 and config.shift_terminal == 0.02
    run = load_run(run_dir, device="cpu")
    ours = run.generate_images(PROMPTS, SEEDS, run.settings(4, 3.0))
    packed = pack(family_runs.seeded_noise(run.text_to_image.latent_shape, SEEDS))  # the pipeline's latents
    theirs = pipe(list(PROMPTS), latents=packed, output_type="pt", **generation).images
    assert theirs.shape == ours.shape == (1, 3, 16, 16)
    difference = (theirs - ours).abs().max().item()
    print(f"max abs difference, QwenImagePipeline vs our sampler (CFG 3): {difference:.2e}")
    assert difference < 1e-4
    plain = {key: value for key, value in generation.items() if key != "negative_prompt"} | {"true_cfg_scale": 1.0}
    unguided = pipe(list(PROMPTS), latents=packed, output_type="pt", **plain).images
    assert (unguided - ours).abs().max() > 1e-3  # the guidance reaches the transformer


@pytest.mark.slow
def test_qwen_image_lora_trains_only_the_adapters(qwen_image_folder, tmp_path):
    """Every adapter trains but those of the last block's text output, which nothing reads: they stay frozen at
    zero (the gradient-flow check would stop a run that trained them)."""
    adapter = family_runs.train_lora(
        tmp_path / "lora", qwen_image_folder, *qwen_image_overrides(qwen_image_folder), every_b=False
    )
    targets = {name.split(".lora_")[0].split(".0.", 1)[-1] for name in adapter}
    assert {"attn.to_q", "attn.add_k_proj", "attn.to_add_out", "img_mlp.net.0.proj", "txt_mlp.net.2"} <= targets
    dead = ("attn.add_q_proj", "attn.to_add_out", "txt_mlp")  # the only block is the last
    for name, weights in adapter.items():
        if "lora_B" in name:
            assert (weights.abs().sum() > 0) != any(f".{end}." in name for end in dead), name


@pytest.mark.slow
@pytest.mark.parametrize("method", ["grpo", "nft"])
def test_every_online_method_fine_tunes_a_qwen_image_run(qwen_image_runs, tmp_path, method):
    init = qwen_image_runs / "straight"
    shutil.rmtree(init / "checkpoints" / "checkpoint-15", ignore_errors=True)  # the methods start from the latest
    if method == "grpo":
        overrides = grpo_overrides(init, "grpo.group_size=2", "grpo.rollout_batch_size=4", epochs=4)
    else:
        overrides = nft_overrides(init, "nft.group_size=2", "nft.rollout_batch_size=4", epochs=4)
    run_dir = family_runs.train_in_process(tmp_path / method, *overrides, base=())  # the command line, as train.py
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(-1 <= r["rollout/reward_mean"] <= 1 for r in records)
    family_runs.grpo_weights(
        init, run_dir, 4
    )  # (a group of equal rewards, as the tiny model's first may be, moves none)
