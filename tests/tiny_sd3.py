"""A tiny random SD3.5 pipeline folder, laid out like the hub's (text_encoder/ tokenizer/ x 3, vae/, transformer/,
scheduler/, model_index.json): CLIP-L and CLIP-G (8- and 16-dim, projected), a 32-dim T5, a 16-channel AutoencoderKL
with SD3's shift_factor/scaling_factor and no quant convs (as SD3's own), and a 2-block MMDiT with qk_norm and one
dual-attention block (SD3.5-Medium's MMDiT-X code paths). Built from configs, saved with ``save_pretrained``."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline
from transformers import CLIPTextModelWithProjection

from dit_trainer.components.families.sd3 import SD3
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ModelConfig

from .tiny_encoders import clip_tokenizer, own_pipeline_overrides, t5_tokenizer, tiny_clip, tiny_t5, tiny_vae

RESOLUTION = 16  # pixels; the VAE halves it once: 8 x 8 latents, 16 tokens of 2 x 2 patches
T5_LENGTH = 8
SD35_EXTRA = {"qk_norm": "rms_norm", "dual_attention_layers": [0]}
TRANSFORMER = {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 8, "patch_size": 2}


def overrides(root: Path) -> list[str]:
    """Overrides (after TINY_SHAPES) that train a new tiny MMDiT-X on 16-px shapes with the encoders and VAE of
    the pipeline folder ``root``."""
    return own_pipeline_overrides(
        "sd3", root, T5_LENGTH, RESOLUTION, TRANSFORMER, "diffusion.shift=3.0",
        "+model.extra_config.qk_norm=rms_norm", "+model.extra_config.dual_attention_layers=[0]",
    )  # fmt: skip


def write_tiny_sd3(root: Path) -> Path:
    """The pipeline folder in ``root`` (seeded: the same weights every time)."""
    torch.manual_seed(0)
    tokenizer, tokenizer_3 = clip_tokenizer(), t5_tokenizer()
    t5 = tiny_t5(tokenizer_3, 32)
    model = ModelConfig(family="sd3", **TRANSFORMER, extra_config=SD35_EXTRA)
    transformer = SD3.build(model, 16, RESOLUTION // 2, ConditionSize(32, 8 + 16))
    StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=tiny_vae(scaling_factor=1.5305, shift_factor=0.0609),  # SD3's
        text_encoder=tiny_clip(tokenizer, 8, CLIPTextModelWithProjection, projection_dim=8),
        tokenizer=tokenizer,
        text_encoder_2=tiny_clip(tokenizer, 16, CLIPTextModelWithProjection, projection_dim=16),
        tokenizer_2=tokenizer,
        text_encoder_3=t5,
        tokenizer_3=tokenizer_3,
    ).save_pretrained(root)
    return root
