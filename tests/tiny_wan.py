"""A tiny random Wan pipeline folder, laid out like the hub's (tokenizer/, text_encoder/, vae/, transformer/,
scheduler/, model_index.json): a letter-level tokenizer, a 2-layer 16-dim UMT5, a 4-channel AutoencoderKLWan (8x in
space, 4x in time after the first frame, with per-channel statistics), a Wan transformer of one block (2 heads x 12
dims), and the flow-matching scheduler at Wan's shift 3; and a folder of moving-shapes MP4 clips to train it on.
Built from configs, saved with ``save_pretrained``."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, WanPipeline
from transformers import UMT5Config, UMT5EncoderModel

from dit_trainer.components.families.wan import WAN
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ModelConfig
from dit_trainer.data.sources.moving_shapes import write_moving_shapes_folder
from dit_trainer.diffusion.flow import euler_scheduler

from .tiny_encoders import own_pipeline_overrides, t5_tokenizer

RESOLUTION, FRAMES, CLIPS = 32, 5, 40  # 5 frames -> 2 latent frames of 4 x 4: 8 tokens of 1 x 2 x 2
MAX_LENGTH = 32  # a token a letter
WIDTH = 16
SHIFT = 3.0  # Wan 2.1's flow shift at 480p
TRANSFORMER = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 12, "patch_size": 2}


def wan_overrides(root: Path) -> list[str]:
    """Train a new tiny Wan with the folder's UMT5 and VAE on its ``clips/`` (5-frame MP4s at 32 px)."""
    return own_pipeline_overrides(
        "wan", root, MAX_LENGTH, RESOLUTION, TRANSFORMER, "vae.kind=wan", f"diffusion.shift={SHIFT}",
        "data.source=videofolder", f"data.path={root / 'clips'}", f"data.frames={FRAMES}", "data.cache_latents=false",
        "+model.extra_config.ffn_dim=32",
    )  # fmt: skip


def write_tiny_wan(root: Path) -> Path:
    """The pipeline folder in ``root`` and its ``clips/`` (seeded: the same weights every time)."""
    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    text_encoder = UMT5EncoderModel(
        UMT5Config(vocab_size=len(tokenizer), d_model=WIDTH, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                   relative_attention_num_buckets=8)
    )  # fmt: skip
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.0, 0.1, 0.2, 0.3], latents_std=[1.0, 1.5, 2.0, 2.5],
    )  # fmt: skip
    model = ModelConfig(family="wan", **TRANSFORMER, extra_config={"ffn_dim": 32})
    WanPipeline(
        transformer=WAN.build(model, 4, RESOLUTION // 8, ConditionSize(WIDTH)),
        scheduler=euler_scheduler(1000, SHIFT, None),
        vae=vae.eval(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
    ).save_pretrained(root)
    write_moving_shapes_folder(root / "clips", CLIPS, FRAMES, RESOLUTION)
    return root
