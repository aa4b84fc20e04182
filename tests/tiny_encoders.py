"""What the tiny random pipeline folders of the families' tests (``tiny_sd3``, ``tiny_flux``, ``tiny_sana``) are made
of: letter-level CLIP and T5 tokenizers, 2-layer CLIP and T5 encoders, a 16-channel AutoencoderKL without quant
convs (as SD3's and Flux's own), built from configs; and the overrides that train a new tiny transformer of a family
on the encoders and VAE of such a folder."""

from __future__ import annotations

import string
from pathlib import Path

from diffusers import AutoencoderKL
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5Tokenizer

CLIP_LENGTH = 77  # CLIP's tokenizer length, which the pipelines encode their CLIP prompts to


def clip_tokenizer() -> CLIPTokenizer:
    """Letters as tokens (a word's last letter with CLIP's end-of-word mark), 77 tokens as CLIP's."""
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for suffix in ("", "</w>"):
        vocab |= {letter + suffix: len(vocab) + i for i, letter in enumerate(string.ascii_lowercase)}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=CLIP_LENGTH)


def t5_tokenizer() -> T5Tokenizer:
    """Letters as pieces, a word's first letter with the sentencepiece word mark."""
    letters = string.ascii_lowercase
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    return T5Tokenizer(vocab=pieces + [("▁" + c, -1.0) for c in letters] + [(c, -2.0) for c in letters])


def tiny_clip(tokenizer: CLIPTokenizer, width: int, model_class: type = CLIPTextModel, **config) -> CLIPTextModel:
    """A 2-layer CLIP text encoder of ``width`` (``model_class``: ``CLIPTextModelWithProjection`` with
    ``projection_dim`` in ``config`` for SD3's)."""
    return model_class(
        CLIPTextConfig(
            vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=CLIP_LENGTH, bos_token_id=0, eos_token_id=1,
            pad_token_id=1, **config,
        )
    ).eval()  # fmt: skip


def tiny_t5(tokenizer: T5Tokenizer, width: int) -> T5EncoderModel:
    """A 2-layer T5 encoder of ``width`` (4 heads of 8)."""
    config = T5Config(vocab_size=len(tokenizer), d_model=width, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    return T5EncoderModel(config).eval()


def tiny_vae(scaling_factor: float, shift_factor: float) -> AutoencoderKL:
    """A 16-channel AutoencoderKL that halves the image once, with no quant convs and a family's latent
    normalisation (SD3's, Flux's ``scaling_factor`` and ``shift_factor``)."""
    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, latent_channels=16,
        scaling_factor=scaling_factor, shift_factor=shift_factor, use_quant_conv=False, use_post_quant_conv=False,
    ).eval()  # fmt: skip


def own_pipeline_overrides(
    family: str, root: Path, max_length: int, resolution: int, transformer: dict, *extra: str
) -> list[str]:
    """Overrides (after TINY_SHAPES) that train a new tiny ``family`` transformer (``transformer``: its
    ``model.*`` sizes) with flow matching on ``resolution``-px shapes, with the family's own conditioner
    (``conditioner.kind=<family>``) and VAE read from the pipeline folder ``root``; ``extra`` after them."""
    return [
        f"model.family={family}",
        *(f"model.{key}={value}" for key, value in transformer.items()),
        "diffusion=flow",
        "diffusion.objective=flow_matching",  # the shapes experiment sets v_prediction on top of its group
        f"conditioner.kind={family}",
        f"conditioner.pretrained={root}",
        f"conditioner.max_length={max_length}",
        f"vae.pretrained={root}",
        "vae.subfolder=vae",
        f"data.resolution={resolution}",
        *extra,
    ]
