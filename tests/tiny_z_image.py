"""A tiny random Z-Image pipeline folder, laid out like the hub's (tokenizer/, text_encoder/, vae/, transformer/,
scheduler/, model_index.json): a letter-level tokenizer carrying a Qwen-style chat template, a 2-layer 16-dim Qwen3
decoder, a 16-channel AutoencoderKL with FLUX.1's shift_factor/scaling_factor (Z-Image's VAE is FLUX.1's), a
Z-Image transformer of one refiner block per stream and one joint block (2 heads x 16 dims), and the
resolution-shifted scheduler. Built from configs, saved with ``save_pretrained``."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import ZImagePipeline
from transformers import Qwen3Config, Qwen3Model

from dit_trainer.components.families.z_image import Z_IMAGE
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ModelConfig
from dit_trainer.diffusion.flow import ResolutionShift, euler_scheduler

from .tiny_encoders import own_pipeline_overrides, t5_tokenizer, tiny_vae

RESOLUTION = 16  # pixels; the VAE halves it once: 8 x 8 latents, 16 tokens of 2 x 2 patches
MAX_LENGTH = 96  # the chat template takes about 35 of them (a token a letter)
WIDTH = 16
TRANSFORMER = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 16, "patch_size": 2}
EXTRA = {"n_refiner_layers": 1, "axes_lens": [256, 32, 32]}
# Qwen3's template as Z-Image uses it: the user's turn, then the assistant's opened (thinking enabled: no empty
# think block).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def z_image_overrides(root: Path) -> list[str]:
    """Train a new tiny Z-Image with the folder's Qwen3 and VAE on 16-px shapes, the resolution shift on."""
    return own_pipeline_overrides(
        "z_image", root, MAX_LENGTH, RESOLUTION, TRANSFORMER, "diffusion.resolution_shift=true",
        *(f"+model.extra_config.{key}={value}" for key, value in EXTRA.items()),
    )  # fmt: skip


def write_tiny_z_image(root: Path) -> Path:
    """The pipeline folder in ``root`` (seeded: the same weights every time)."""
    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    qwen3 = Qwen3Model(
        Qwen3Config(
            vocab_size=len(tokenizer), hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=256,
        )
    ).eval()  # fmt: skip
    model = ModelConfig(family="z_image", **TRANSFORMER, extra_config=EXTRA)
    ZImagePipeline(
        transformer=Z_IMAGE.build(model, 16, RESOLUTION // 2, ConditionSize(WIDTH)),
        scheduler=euler_scheduler(1000, 1.0, ResolutionShift()),
        vae=tiny_vae(scaling_factor=0.3611, shift_factor=0.1159),  # FLUX.1's, as Z-Image's VAE
        text_encoder=qwen3,
        tokenizer=tokenizer,
    ).save_pretrained(root)
    return root
