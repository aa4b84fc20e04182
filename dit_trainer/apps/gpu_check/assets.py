"""Tiny random models and data, written to a folder, so that the GPU check needs no hub access: a T5 encoder with a
letter tokenizer (as PixArt's repository lays it out), a CLIP with the same tokenizer (the ``clip_score`` reward),
an 8x-downsampling VAE standing in for the SD VAE where only the latents' shape matters (throughput from a cache),
and a folder of shapes images."""

from __future__ import annotations

import os
import shutil
import string
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import AutoencoderKL
from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, T5Config, T5EncoderModel, T5Tokenizer

from dit_trainer.data.sources.shapes import write_shapes_folder

SHIPPED_VAE = Path(__file__).resolve().parents[2] / "assets" / "shapes_vae"  # 32 px -> 4 x 16 x 16, trained


@dataclass(frozen=True)
class Assets:
    t5: Path  # text_encoder/ and tokenizer/ subfolders
    vae8: Path  # random AutoencoderKL, 8x downsampling, 4 latent channels
    images: Path  # imagefolder of 32 px shapes with metadata.jsonl
    clip: Path  # random CLIPModel (32 px, 2 layers), the letter tokenizer and a preprocessor config


def letter_tokenizer() -> T5Tokenizer:
    """Every letter a piece (with and without the word mark): any caption tokenizes, no vocabulary file needed."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    letters = string.ascii_lowercase
    return T5Tokenizer(vocab=pieces + [("▁" + c, -1.0) for c in letters] + [(c, -2.0) for c in letters])


def _write_t5(folder: Path) -> None:
    torch.manual_seed(0)
    tokenizer = letter_tokenizer()
    config = T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    T5EncoderModel(config).save_pretrained(folder / "text_encoder")
    tokenizer.save_pretrained(folder / "tokenizer")


def _write_clip(folder: Path) -> None:
    torch.manual_seed(0)
    tokenizer = letter_tokenizer()
    layers = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    # the letter tokenizer's ids: the text model pools at its end-of-sequence token "</s>"; it has no start token
    ids = {"pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 1}
    text = {**layers, **ids, "vocab_size": len(tokenizer), "max_position_embeddings": 32}
    vision = {**layers, "image_size": 32, "patch_size": 8}
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)


def _write_vae8(folder: Path) -> None:
    torch.manual_seed(0)
    AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8,) * 4, layers_per_block=1, norm_num_groups=4, latent_channels=4,
    ).save_pretrained(folder)  # fmt: skip


def write_assets(folder: Path, images: int = 64) -> Assets:
    """The tiny models and data under ``folder`` (written once; a second call reuses them). Each is written beside
    its place and renamed into it, so a call stopped while writing (a GPU machine's command limit) leaves none half
    written for the next call to reuse; the processes of a launch may all write, the first rename wins."""
    assets = Assets(folder / "t5", folder / "vae8", folder / "images", folder / "clip")
    writers = {assets.t5: _write_t5, assets.vae8: _write_vae8, assets.clip: _write_clip,
               assets.images: lambda path: write_shapes_folder(path, images, [(32, 32)])}  # fmt: skip
    for target, write in writers.items():
        if target.is_dir():
            continue
        partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        write(partial)
        try:
            partial.rename(target)
        except OSError:  # another process of the launch renamed its copy first
            shutil.rmtree(partial, ignore_errors=True)
    return assets
