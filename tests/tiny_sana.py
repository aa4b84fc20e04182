"""A tiny random Sana pipeline folder, laid out like a Sana diffusers repository (``transformer/``, ``vae/``,
``text_encoder/``, ``tokenizer/``, ``scheduler/``, ``model_index.json``), for the Sana family's tests: a 2-layer
Gemma-2 with a character-level Gemma tokenizer, a 3-block ``AutoencoderDC`` (4x: 32 px -> 8 x 8 x 8 latents) and a
2-layer ``SanaTransformer2DModel``."""

from __future__ import annotations

import string
from pathlib import Path

import torch
from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline
from transformers import Gemma2Config, Gemma2Model, GemmaTokenizer

from dit_trainer.components.families.sana import build as build_sana
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ModelConfig

from .tiny_encoders import own_pipeline_overrides

LATENT_CHANNELS, LATENT_SIZE, TEXT_DIM = 8, 8, 16
# The tiny transformer's ModelConfig fields (from scratch: `model.<key>=<value>` overrides).
TRANSFORMER = {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 8, "patch_size": 1}
SCALING_FACTOR = 0.5


def tiny_tokenizer() -> GemmaTokenizer:
    """One token per printable character, a few merges so that a token is not always a character, and <bos> first
    (as Gemma's tokenizer)."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    characters = ["▁" if c == " " else c for c in string.printable if c not in "\r\x0b\x0c"]
    merges = [("▁", "a"), ("r", "e"), ("e", "d"), ("▁", "c"), ("i", "r"), ("l", "e")]
    pieces = [*specials, *dict.fromkeys(characters), *(a + b for a, b in merges)]
    return GemmaTokenizer(vocab={piece: i for i, piece in enumerate(pieces)}, merges=merges, add_bos_token=True)


def tiny_gemma(vocab_size: int) -> Gemma2Model:
    config = Gemma2Config(
        vocab_size=vocab_size,
        hidden_size=TEXT_DIM,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=2048,
        sliding_window=64,
    )
    return Gemma2Model(config).eval()


def tiny_autoencoder() -> AutoencoderDC:
    blocks = (8, 16, 16)
    return AutoencoderDC(
        latent_channels=LATENT_CHANNELS,
        attention_head_dim=8,
        encoder_block_types="ResBlock",
        decoder_block_types="ResBlock",
        encoder_block_out_channels=blocks,
        decoder_block_out_channels=blocks,
        encoder_layers_per_block=(1, 1, 1),
        decoder_layers_per_block=(1, 1, 1),
        encoder_qkv_multiscales=((), (), ()),
        decoder_qkv_multiscales=((), (), ()),
        scaling_factor=SCALING_FACTOR,
    ).eval()


def tiny_transformer(**model):
    """A random ``SanaTransformer2DModel`` built by the family from TRANSFORMER's sizes (or ``model``'s)."""
    cfg = ModelConfig(family="sana", **{**TRANSFORMER, **model})
    return build_sana(cfg, LATENT_CHANNELS, LATENT_SIZE, ConditionSize(TEXT_DIM))


def write_sana_folder(root: Path, seed: int = 0) -> Path:
    """The tiny pipeline saved with ``save_pretrained`` into ``root`` (loaded back by path in the tests)."""
    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer()
    pipeline = SanaPipeline(
        tokenizer=tokenizer,
        text_encoder=tiny_gemma(len(tokenizer)),
        vae=tiny_autoencoder(),
        transformer=tiny_transformer(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )
    pipeline.save_pretrained(root)
    return root


def sana_overrides(folder: Path, *extra: str) -> list[str]:
    """A tiny Sana run on the 32-px shapes data with ``folder``'s VAE and Gemma-2 and a new 2-layer transformer
    (flow matching, logit-normal timesteps, Euler sampling), no sample grids or validation."""
    return own_pipeline_overrides(
        "sana", folder, 12, 32, TRANSFORMER, "vae.kind=autoencoder_dc", "conditioner.memo_size=64",
        "conditioner.instruction=[Describe the image.,'User Prompt: ']", "diffusion.shift=3.0", *extra,
    )  # fmt: skip
