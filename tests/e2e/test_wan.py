"""Wan end to end, in-process, on a tiny random Wan pipeline folder (``tests/tiny_wan.py``: its UMT5 conditioner and
video VAE) trained on a folder of MP4 clips: training, resuming bit for bit, LoRA, an export that
``WanPipeline.from_pretrained`` loads and that generates our sampler's clip from the same noise (prompts as text),
``scripts/sample.py`` writing one MP4 per prompt and seed, the same clips from webdataset shards, resumed at the
stream's position, and from the disk cache ``scripts/precompute.py`` writes, and clips of three shapes in
aspect-ratio buckets."""

import json
from itertools import islice

import av
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from dit_trainer.assemble import build_trainer
from dit_trainer.data.sources.videofolder import write_mp4
from dit_trainer.training.batches import resumable_batches

from ..conftest import CACHE, TINY_SHAPES, compose_config, run_here
from ..data.files import video_folder_shards
from ..tiny_wan import FRAMES, RESOLUTION, wan_overrides, write_tiny_wan
from . import family_runs

PROMPTS, SEEDS = ["a red circle moving left"], [3]
# The tiny pipeline folder and its clips (`wan_folder`) and 30 steps on it with a copy resumed at step 15 (`wan_runs`).
wan_folder, wan_runs = family_runs.family_fixtures("wan", write_tiny_wan, wan_overrides)


@pytest.mark.slow
def test_wan_trains_on_clips_and_a_resumed_run_matches_the_uninterrupted_one(wan_runs):
    losses = family_runs.check_resumed_run(wan_runs)
    print(f"wan loss: first 5 steps {sum(losses[:5]) / 5:.3f} -> last 5 {sum(losses[-5:]) / 5:.3f}")
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses
    config = json.loads(
        (wan_runs / "straight" / "checkpoints" / "checkpoint-30" / "transformer" / "config.json").read_text()
    )
    assert config["_class_name"] == "WanTransformer3DModel" and config["text_dim"] == 16 and config["in_channels"] == 4


@pytest.mark.slow
def test_wan_export_is_a_wan_pipeline_that_reproduces_our_sampler(wan_runs, tmp_path):
    """With CFG (the empty prompt as the negative one): the pipeline's clip from our sampler's noise."""
    from diffusers import WanPipeline

    from dit_trainer.apps.inference import load_run

    run_dir, folder = wan_runs / "straight", tmp_path / "export"
    result = family_runs.export(run_dir, folder, "WanPipeline")
    generation = result.manifest["generation"]
    assert generation == {"height": RESOLUTION, "width": RESOLUTION, "num_frames": FRAMES, "num_inference_steps": 4,
                          "guidance_scale": 3.0, "negative_prompt": "", "max_sequence_length": 32}  # fmt: skip
    pipe = WanPipeline.from_pretrained(folder)
    run = load_run(run_dir, device="cpu")
    ours = run.generate_images(PROMPTS, SEEDS, run.settings(4, 3.0))
    noise = family_runs.seeded_noise(run.text_to_image.latent_shape, SEEDS)
    theirs = pipe(list(PROMPTS), latents=noise, output_type="pt", **generation).frames.transpose(1, 2)
    assert theirs.shape == ours.shape == (1, 3, FRAMES, RESOLUTION, RESOLUTION)
    difference = (theirs - ours).abs().max().item()
    print(f"max abs difference, WanPipeline vs our sampler (CFG 3): {difference:.2e}")
    assert difference < 1e-4
    unguided = pipe(list(PROMPTS), latents=noise, output_type="pt", **(generation | {"guidance_scale": 1.0})).frames
    assert (unguided.transpose(1, 2) - ours).abs().max() > 1e-3  # the guidance reaches the transformer


@pytest.mark.slow
def test_sample_py_writes_one_mp4_per_prompt_and_seed(wan_runs, tmp_path):
    from dit_trainer.apps.cli import run_cli
    from dit_trainer.apps.inference import sample_to_folder
    from dit_trainer.config import SampleConfig

    out_dir = tmp_path / "samples"
    argv = [str(wan_runs / "straight"), f"out_dir={out_dir}", "prompts=[a red circle moving left]",
            "images_per_prompt=2", "steps=2"]  # fmt: skip
    assert run_cli(sample_to_folder, SampleConfig, argv, "usage: sample.py") == 0
    index = [json.loads(line) for line in (out_dir / "index.jsonl").read_text().splitlines()]
    assert [entry["file"] for entry in index] == ["00000.mp4", "00001.mp4"]
    with av.open(str(out_dir / "00000.mp4")) as container:
        frames = list(container.decode(video=0))
    assert len(frames) == FRAMES and (frames[0].height, frames[0].width) == (RESOLUTION, RESOLUTION)


@pytest.mark.slow
def test_wan_lora_trains_only_the_adapters(wan_folder, tmp_path):
    adapter = family_runs.train_lora(tmp_path / "lora", wan_folder, *wan_overrides(wan_folder))
    targets = {name.split(".lora_")[0].split(".0.", 1)[-1] for name in adapter}
    assert {"attn1.to_q", "attn2.to_k", "attn1.to_out.0", "ffn.net.0.proj", "ffn.net.2"} <= targets


@pytest.mark.slow
def test_wan_trains_on_video_shards_and_a_resumed_run_continues_the_stream(wan_folder, tmp_path):
    """The tiny Wan's clips as tar shards (``data=webdataset``, 5 batches an epoch): 7 steps, and the same run
    resumed from step 3: the same losses bit for bit, so the stream went on from its saved shard position."""
    pattern = video_folder_shards(wan_folder / "clips", tmp_path / "shards")
    shards = ("data.source=webdataset", f"data.path='{pattern}'", "data.caption_column=txt", "data.shuffle_buffer=4")
    common = (*wan_overrides(wan_folder), *shards, *family_runs.COMMON[:2], "trainer.batch_size=8",
              "trainer.checkpoint_every=3", "trainer.max_steps=7")  # fmt: skip
    straight = family_runs.losses(family_runs.train_in_process(tmp_path / "straight", *common))
    resume = f"trainer.resume={tmp_path / 'straight' / 'checkpoints' / 'checkpoint-3'}"
    resumed = family_runs.losses(family_runs.train_in_process(tmp_path / "resumed", *common, resume))
    assert sorted(straight) == list(range(1, 8)) and sorted(resumed) == list(range(4, 8))
    assert [resumed[step] for step in range(4, 8)] == [straight[step] for step in range(4, 8)]


@pytest.mark.slow
def test_wan_trains_from_the_disk_cache_of_its_clips_as_encoding_every_batch(wan_folder, tmp_path):
    """``scripts/precompute.py`` writes the clips' posteriors (4 x 2 x 4 x 4 each) and UMT5 embeddings; training
    from them takes the losses of encoding every batch."""
    common = (*wan_overrides(wan_folder), *CACHE, *family_runs.COMMON[:2], "trainer.max_steps=4")
    result = run_here(["scripts/precompute.py", *TINY_SHAPES, *common, f"data.cache_dir={tmp_path / 'cache'}"])
    assert result.returncode == 0 and "encoded 40 items" in result.stdout, result.stderr[-3000:]
    index = json.loads((tmp_path / "cache" / "index.json").read_text())
    shard = load_file(tmp_path / "cache" / index["shards"][0]["file"])
    assert shard["latent_mean"].shape[1:] == (4, 2, 4, 4) and shard["text_embeds"].shape[-1] == 16
    encoded = family_runs.losses(family_runs.train_in_process(tmp_path / "encoded", *common))
    cached = family_runs.train_in_process(tmp_path / "cached", *common, f"data.cache_dir={tmp_path / 'cache'}")
    assert list(family_runs.losses(cached).values()) == pytest.approx(list(encoded.values()), rel=1e-5)


CLIP_SIZES = [(32, 32), (32, 48), (48, 32)]  # (height, width): whole 16-pixel patches of the tiny Wan


def write_clips_of_three_shapes(folder) -> None:
    """8 clips of 5 frames in each of ``CLIP_SIZES``, listed without their sizes (buckets read the headers)."""
    folder.mkdir()
    rows = []
    for number in range(24):
        height, width = CLIP_SIZES[number % 3]
        frames = np.full((FRAMES, height, width, 3), 128, dtype=np.uint8)
        for k in range(FRAMES):
            frames[k, 8:20, 4 + 2 * k : 16 + 2 * k] = (40 * (number % 6), 200, 60)  # a square moving right
        write_mp4(frames, folder / f"{number:02d}.mp4", fps=8)
        rows.append(json.dumps({"file_name": f"{number:02d}.mp4", "text": f"a square {number % 6}"}) + "\n")
    (folder / "metadata.jsonl").write_text("".join(rows))


@pytest.mark.slow
def test_wan_trains_on_clips_in_aspect_ratio_buckets_and_resumes_their_batches(wan_folder, tmp_path):
    write_clips_of_three_shapes(tmp_path / "clips")
    buckets = ("data.buckets=[[32,32],[32,48],[48,32]]", f"data.path={tmp_path / 'clips'}", "data.num_workers=0")
    overrides = [*TINY_SHAPES, *wan_overrides(wan_folder), *buckets, "trainer.batch_size=4"]
    trainer = build_trainer(compose_config(overrides), tmp_path / "run")
    batches = list(islice(resumable_batches(trainer.step.dataloader, trainer.accelerator, 0), 10))  # 6 an epoch
    assert {tuple(batch["image"].shape[-3:]) for batch in batches} == {(FRAMES, h, w) for h, w in CLIP_SIZES}
    resumed = list(islice(resumable_batches(trainer.step.dataloader, trainer.accelerator, 7), 3))
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(resumed, batches[7:], strict=True))
    steps = (*family_runs.COMMON[:2], "trainer.max_steps=6")
    trained = family_runs.train_in_process(tmp_path / "trained", *overrides[len(TINY_SHAPES) :], *steps)
    assert sorted(family_runs.losses(trained)) == list(range(1, 7))
