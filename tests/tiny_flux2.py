"""A tiny random FLUX.2 [klein] pipeline folder, laid out like the hub's (tokenizer/, text_encoder/, vae/,
transformer/, scheduler/, model_index.json): a letter-level tokenizer carrying a Qwen-style chat template, a
28-layer 8-dim Qwen3 (FLUX.2 reads its layers 9, 18 and 27: 24-dim text features), an AutoencoderKLFlux2 of 4
channels that halves the image once (16 channels once patched 2 x 2, at a quarter of the image) with random
BatchNorm statistics, and a FLUX.2 transformer of one double and one single block (2 heads x 16 dims). Built from
configs, saved with ``save_pretrained``; trained on FLUX.2's own schedule (its empirical mu)."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderKLFlux2, Flux2KleinPipeline
from transformers import Qwen3Config, Qwen3ForCausalLM

from dit_trainer.components.families.flux2 import FLUX2
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ModelConfig
from dit_trainer.diffusion.flow import ResolutionShift, euler_scheduler

from .tiny_encoders import own_pipeline_overrides, t5_tokenizer
from .tiny_z_image import CHAT_TEMPLATE

RESOLUTION = 16  # pixels; the VAE halves it once and the patches again: 4 x 4 latents of 16 channels
MAX_LENGTH = 96  # the chat template takes about 35 of them (a token a letter)
WIDTH, LAYERS = 8, 28  # Qwen3's width and depth: FLUX.2 reads 3 of its layers, 24 features a token
TRANSFORMER = {"num_layers": 1, "num_attention_heads": 2, "attention_head_dim": 16, "patch_size": 1}
EXTRA = {"num_single_layers": 1}
SHIFT = ResolutionShift(empirical_steps=50)  # FLUX.2's scheduler: its pipeline's empirical mu


def flux2_overrides(root: Path) -> list[str]:
    """Train a new tiny FLUX.2 with the folder's Qwen3 and VAE on 16-px shapes, on FLUX.2's own schedule."""
    return own_pipeline_overrides(
        "flux2", root, MAX_LENGTH, RESOLUTION, TRANSFORMER, "vae.kind=flux2", "diffusion.resolution_shift=true",
        "diffusion.resolution_shift_rule=flux2",
        *(f"+model.extra_config.{key}={value}" for key, value in EXTRA.items()),
    )  # fmt: skip


def write_tiny_flux2(root: Path) -> Path:
    """The pipeline folder in ``root`` (seeded: the same weights every time)."""
    torch.manual_seed(0)
    tokenizer = t5_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    qwen3 = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tokenizer), hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=LAYERS,
            num_attention_heads=2, num_key_value_heads=1, head_dim=4, max_position_embeddings=256,
        )
    ).eval()  # fmt: skip
    vae = AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, latent_channels=4,
    ).eval()  # fmt: skip
    vae.bn.running_mean.normal_(0, 0.5)
    vae.bn.running_var.uniform_(0.5, 2.0)
    model = ModelConfig(family="flux2", **TRANSFORMER, extra_config=EXTRA)
    Flux2KleinPipeline(
        transformer=FLUX2.build(model, 16, RESOLUTION // 4, ConditionSize(3 * WIDTH)),
        scheduler=euler_scheduler(1000, 1.0, SHIFT),
        vae=vae,
        text_encoder=qwen3,
        tokenizer=tokenizer,
    ).save_pretrained(root)
    return root
