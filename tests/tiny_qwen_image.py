"""A tiny random Qwen-Image pipeline folder, laid out like the hub's (tokenizer/, text_encoder/, vae/, transformer/,
scheduler/, model_index.json): a letter-level tokenizer, a 2-layer 16-dim Qwen2.5-VL (its vision tower one block),
a 16-channel AutoencoderKLQwenImage that halves the image once (with Qwen-Image's per-channel statistics), a
Qwen-Image transformer of one block (2 heads x 16 dims), and Qwen-Image's resolution-shifted scheduler. Built from
configs, saved with ``save_pretrained``."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLQwenImage, QwenImagePipeline
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

from dit_trainer.components.families.qwen_image import QWEN_IMAGE
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ModelConfig
from dit_trainer.diffusion.flow import ResolutionShift, euler_scheduler

from .tiny_encoders import own_pipeline_overrides, t5_tokenizer

RESOLUTION = 16  # pixels; the VAE halves it once: 8 x 8 latents, 16 tokens of 2 x 2 patches
MAX_LENGTH = 192  # tokens past the template's first 34: a token a letter, the rest of its system turn takes ~146
WIDTH = 16
TRANSFORMER = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 16, "patch_size": 2}
SHIFT = ResolutionShift(0.5, 0.9, 256, 8192)  # Qwen-Image's scheduler: max_shift 0.9 at 8,192 tokens


def qwen_image_overrides(root: Path) -> list[str]:
    """Train a new tiny Qwen-Image with the folder's Qwen2.5-VL and VAE on 16-px shapes, its resolution shift (and
    its sampler's last level, 0.02) on."""
    return own_pipeline_overrides(
        "qwen_image", root, MAX_LENGTH, RESOLUTION, TRANSFORMER, "vae.kind=qwen_image",
        "diffusion.resolution_shift=true", "diffusion.max_shift=0.9", "diffusion.max_image_seq_len=8192",
        "diffusion.shift_terminal=0.02",
    )  # fmt: skip


def tiny_qwen2_5_vl(vocab_size: int) -> Qwen2_5_VLForConditionalGeneration:
    """Qwen2.5-VL's class at 16 dims, 2 text layers and one vision block (the pipeline never calls the latter)."""
    text = {
        "vocab_size": vocab_size, "hidden_size": WIDTH, "intermediate_size": 2 * WIDTH, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512,
        "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}, "bos_token_id": 0, "eos_token_id": 1,
    }  # fmt: skip
    vision = {"depth": 1, "hidden_size": WIDTH, "intermediate_size": 2 * WIDTH, "num_heads": 2,
              "out_hidden_size": WIDTH, "fullatt_block_indexes": [0]}  # fmt: skip
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision)).eval()


def write_tiny_qwen_image(root: Path) -> Path:
    """The pipeline folder in ``root`` (seeded: the same weights every time)."""
    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False])
    model = ModelConfig(family="qwen_image", **TRANSFORMER)
    QwenImagePipeline(
        transformer=QWEN_IMAGE.build(model, 16, RESOLUTION // 2, ConditionSize(WIDTH)),
        scheduler=euler_scheduler(1000, 1.0, SHIFT),
        vae=vae.eval(),
        text_encoder=tiny_qwen2_5_vl(len(tokenizer)),
        tokenizer=tokenizer,
    ).save_pretrained(root)
    return root
