"""SD3 / SD3.5 end to end on a tiny random pipeline folder (``tests/tiny_sd3.py``: its own CLIP-L, CLIP-G, T5, VAE
and an MMDiT-X transformer), trained in-process: the loss falls, a resumed run is the uninterrupted one bit for bit,
LoRA trains only its adapters, GRPO runs, and the export is a ``StableDiffusion3Pipeline`` folder that generates
what our sampler does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

from dit_trainer.apps.inference import load_run

from ..conftest import QUICK, grpo_overrides, read_metrics
from ..tiny_sd3 import RESOLUTION, T5_LENGTH, overrides, write_tiny_sd3
from . import family_runs

PROMPTS, SEEDS = ["a red circle", "a blue square"], [3, 4]
# The tiny pipeline folder (`sd3_folder`) and 30 steps of a new MMDiT-X (qk_norm, a dual-attention block) on SD3's
# encoders and VAE, with a copy resumed at step 15 (`sd3_runs`).
sd3_folder, sd3_runs = family_runs.family_fixtures("sd3", write_tiny_sd3, overrides)


@pytest.fixture(scope="module")
def sd3_run(sd3_runs) -> Path:
    return sd3_runs / "straight"


@pytest.mark.slow
def test_the_loss_falls_and_a_resumed_run_is_the_uninterrupted_one(sd3_runs):
    losses = family_runs.check_resumed_run(sd3_runs)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.1, (first, last)


@pytest.mark.slow
def test_lora_trains_only_the_adapters_of_the_pretrained_transformer(sd3_folder, tmp_path):
    run_dir = tmp_path / "lora"
    # Not every B: the last block's text queries (add_q_proj) feed no output, so their adapter gets no gradient.
    adapter = family_runs.train_lora(run_dir, sd3_folder, *overrides(sd3_folder), every_b=False)
    adapted = {name.split(".lora_")[0] for name in adapter}
    for module in ("attn.add_q_proj", "attn.to_add_out", "attn2.to_q", "ff.net.2", "ff_context.net.0.proj"):
        assert any(name.endswith("transformer_blocks.0." + module) for name in adapted), module

    base = SD3Transformer2DModel.from_pretrained(sd3_folder / "transformer").state_dict()
    after = load_run(run_dir, ema=False, device="cpu").dit.transformer
    frozen = {name.replace("base_layer.", ""): t for name, t in after.state_dict().items() if "lora_" not in name}
    assert frozen.keys() == base.keys()
    assert all(torch.equal(frozen[name], base[name]) for name in base)  # the base is untouched


@pytest.mark.slow
def test_grpo_fine_tunes_an_sd3_run(sd3_run, tmp_path):
    run_dir = family_runs.train_in_process(tmp_path / "grpo", *grpo_overrides(sd3_run, epochs=3), base=())
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert any(r["policy/updates"] > 0 for r in records)
    family_runs.grpo_weights(sd3_run, run_dir, 3)


def _ours_and_noise(run_dir: Path, steps: int = 3, guidance_scale: float = 3.0):
    trained = load_run(run_dir, device="cpu")
    images = trained.generate_images(PROMPTS, SEEDS, trained.settings(steps, guidance_scale))
    return images, family_runs.seeded_noise(trained.text_to_image.latent_shape, SEEDS)


@pytest.mark.slow
def test_the_export_is_an_sd3_pipeline_that_takes_text_and_matches_our_sampler(sd3_run, tmp_path):
    result = family_runs.export(sd3_run, tmp_path / "export", "StableDiffusion3Pipeline")
    assert result.manifest["generation"]["max_sequence_length"] == T5_LENGTH
    pipe = StableDiffusion3Pipeline.from_pretrained(result.out_dir)
    assert pipe.vae.config.shift_factor == pytest.approx(0.0609)  # SD3's VAE, kept as it is
    ours, noise = _ours_and_noise(sd3_run)
    theirs = pipe(
        PROMPTS, latents=noise, num_inference_steps=3, guidance_scale=3.0, max_sequence_length=T5_LENGTH,
        height=RESOLUTION, width=RESOLUTION, output_type="pt",
    ).images  # fmt: skip
    assert theirs.shape == (2, 3, RESOLUTION, RESOLUTION)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_a_minilm_run_exports_pieces_whose_usage_passes_embeddings_and_matches_our_sampler(tmp_path):
    """The CPU recipe's conditioner (MiniLM with its mean-pooled sentence embedding) and the shapes VAE, whose
    per-channel statistics the export folds into the VAE (its exported shift_factor is 0)."""
    run_dir = family_runs.train_in_process(
        tmp_path / "minilm", *QUICK, "data.length=32", "trainer.batch_size=8", "model.family=sd3",
        "diffusion=flow",
        "diffusion.objective=flow_matching", "conditioner.pooling=mean", "model.num_attention_heads=2",
        "model.attention_head_dim=8",
    )  # fmt: skip
    result = family_runs.export(run_dir, tmp_path / "export", None)
    assert result.manifest["text_encoder"]["pooling"] == "mean"
    namespace: dict = {}
    exec(result.usage.split("image = pipe(")[0], namespace)  # the printed recipe, up to the call
    ours, noise = _ours_and_noise(run_dir)
    embeds, pooled = namespace["embed"](PROMPTS)
    empty, empty_pooled = namespace["embed"]([""] * len(PROMPTS))
    theirs = namespace["pipe"](
        prompt_embeds=embeds, pooled_prompt_embeds=pooled, negative_prompt_embeds=empty,
        negative_pooled_prompt_embeds=empty_pooled, latents=noise, num_inference_steps=3, guidance_scale=3.0,
        height=32, width=32, output_type="pt",
    ).images  # fmt: skip
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
