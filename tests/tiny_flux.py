"""A tiny random FLUX.1-dev pipeline folder, laid out like the hub's (tokenizer/, text_encoder/, tokenizer_2/,
text_encoder_2/, vae/, transformer/, scheduler/, model_index.json): a 16-dim CLIP-L stand-in, a 32-dim T5, a
16-channel AutoencoderKL with Flux's shift_factor/scaling_factor and no quant convs (as Flux's own), and a
guidance-distilled Flux transformer of 1 double and 1 single block (2 heads x 8 dims), with the resolution-shifted
scheduler FLUX.1 ships. Built from configs, saved with ``save_pretrained``."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import FluxPipeline

from dit_trainer.components.families.flux import FLUX
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ModelConfig
from dit_trainer.diffusion.flow import ResolutionShift, euler_scheduler

from .tiny_encoders import clip_tokenizer, own_pipeline_overrides, t5_tokenizer, tiny_clip, tiny_t5, tiny_vae

RESOLUTION = 16  # pixels; the VAE halves it once: 8 x 8 latents, 16 tokens of 2 x 2 patches
T5_LENGTH = 8
CLIP_WIDTH, T5_WIDTH = 16, 32
TRANSFORMER = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 8, "patch_size": 2}
EXTRA = {"num_single_layers": 1, "guidance_embeds": True}


def flux_overrides(root: Path) -> list[str]:
    """Train a new tiny Flux with the folder's encoders and VAE on 16-px shapes, Flux's resolution shift on."""
    return own_pipeline_overrides(
        "flux", root, T5_LENGTH, RESOLUTION, TRANSFORMER, "diffusion.resolution_shift=true",
        *(f"+model.extra_config.{key}={str(value).lower()}" for key, value in EXTRA.items()),
    )  # fmt: skip


def write_tiny_flux(root: Path) -> Path:
    """The pipeline folder in ``root`` (seeded: the same weights every time)."""
    torch.manual_seed(0)
    tokenizer, tokenizer_2 = clip_tokenizer(), t5_tokenizer()
    clip, t5 = tiny_clip(tokenizer, CLIP_WIDTH), tiny_t5(tokenizer_2, T5_WIDTH)
    model = ModelConfig(family="flux", **TRANSFORMER, extra_config=EXTRA)
    FluxPipeline(
        transformer=FLUX.build(model, 16, RESOLUTION // 2, ConditionSize(T5_WIDTH, CLIP_WIDTH)),
        scheduler=euler_scheduler(1000, 1.0, ResolutionShift()),
        vae=tiny_vae(scaling_factor=0.3611, shift_factor=0.1159),  # Flux's
        text_encoder=clip,
        tokenizer=tokenizer,
        text_encoder_2=t5,
        tokenizer_2=tokenizer_2,
    ).save_pretrained(root)
    return root
