"""The trainable DiT behind one call: ``predict(x_t, t, embeds, mask) -> prediction`` shaped like ``x_t``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.utils.checkpoint
from diffusers import PixArtTransformer2DModel
from torch import nn

from dit_trainer.errors import ConfigError
from dit_trainer.hub import load_pretrained, pretrained_config

if TYPE_CHECKING:
    from dit_trainer.config import ModelConfig


class DiTAdapter(nn.Module):
    """Hides the model family's quirks from the training loop and the samplers.

    ``.sample`` vs tuple outputs, the learned-sigma half of the output channels (dropped here: the loss trains
    the mean prediction), and PixArt's ``added_cond_kwargs`` (resolution/aspect ratio micro-conditions) all stop here.
    ``forward`` is the same as ``predict`` so that DDP/FSDP wrappers see every call.
    """

    def __init__(self, transformer: PixArtTransformer2DModel) -> None:
        super().__init__()
        self.transformer = transformer

    def forward(
        self, x_t: torch.Tensor, t: torch.Tensor, embeds: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        config = self.transformer.config
        added_cond_kwargs = {"resolution": None, "aspect_ratio": None}
        if config.use_additional_conditions:
            height, width = (size * 8 for size in x_t.shape[-2:])  # PixArt-alpha conditions on pixel size
            batch = x_t.shape[0]
            added_cond_kwargs = {
                "resolution": torch.tensor([[height, width]], device=x_t.device, dtype=x_t.dtype).repeat(batch, 1),
                "aspect_ratio": torch.tensor([[height / width]], device=x_t.device, dtype=x_t.dtype).repeat(batch, 1),
            }
        dtype = self.compute_dtype
        output = self.transformer(
            x_t.to(dtype),
            encoder_hidden_states=embeds.to(dtype),
            encoder_attention_mask=mask,
            timestep=t.expand(x_t.shape[0]),
            added_cond_kwargs=added_cond_kwargs,
            return_dict=False,
        )[0]
        return output[:, : x_t.shape[1]]

    predict = forward

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the inputs are cast to: that of the patch embedding, the first layer they meet. (diffusers'
        ``ModelMixin.dtype`` walks every submodule looking for casting hooks on each call, twice a forward.)"""
        return self.transformer.pos_embed.proj.weight.dtype


def load_transformer(cfg: ModelConfig) -> PixArtTransformer2DModel:
    """The pretrained transformer ``model.pretrained`` names (hub id or local path). A hub model may ship only a
    pickled ``.bin``; diffusers reads that with ``torch.load(weights_only=True)``, safe from torch 2.6 on."""
    return load_pretrained(
        PixArtTransformer2DModel.from_pretrained,
        cfg.pretrained,
        "model.pretrained",
        subfolder=cfg.subfolder,
        revision=cfg.revision,
    )


def known_patch_size(cfg: ModelConfig) -> int | None:
    """The DiT's patch size before it is built: configured, or from a pretrained DiT's config.json when that is on
    this machine; None until it downloads (``build_dit`` checks the latent size against it then)."""
    if not cfg.pretrained:
        return cfg.patch_size
    return (pretrained_config(cfg.pretrained, cfg.subfolder, cfg.revision) or {}).get("patch_size")


def load_trained_transformer(folder: Path) -> PixArtTransformer2DModel:
    """The transformer in one of our own checkpoint folders, read from safetensors only: dit-trainer never writes a
    pickle there, so a ``.bin`` beside or instead of the weights was planted, and is not unpickled."""
    return PixArtTransformer2DModel.from_pretrained(folder, use_safetensors=True)


def enable_gradient_checkpointing(dit: DiTAdapter, reentrant: bool = False) -> None:
    """Recompute each transformer block in backward. ``reentrant`` picks torch's ``use_reentrant=True`` variant,
    which gives no gradient to a block whose inputs do not require grad (LoRA on a frozen patch embedding)."""

    def checkpoint(block: nn.Module, *args):
        return torch.utils.checkpoint.checkpoint(block.__call__, *args, use_reentrant=reentrant)

    dit.transformer.enable_gradient_checkpointing(checkpoint)


def build_dit(
    cfg: ModelConfig, in_channels: int, sample_size: int, caption_channels: int, weights: Path | None = None
) -> DiTAdapter:
    """A PixArt transformer sized by ``cfg`` whose input follows the VAE (``in_channels``, ``sample_size``); with
    ``weights`` (a checkpoint's transformer folder), the one trained there."""
    if weights is not None or cfg.pretrained:
        transformer = load_transformer(cfg) if weights is None else load_trained_transformer(weights)
        source = str(weights or cfg.pretrained)
        config = transformer.config
        if config.in_channels != in_channels:
            raise ConfigError(
                "model.pretrained",
                source,
                f"it takes {config.in_channels} input channels while the VAE gives {in_channels}",
                "use the VAE this transformer was trained with (`vae=...`)",
            )
        if config.caption_channels != caption_channels:
            raise ConfigError(
                "model.pretrained",
                source,
                f"it expects {config.caption_channels}-dim text features while the text encoder gives "
                f"{caption_channels}",
                "use the text encoder it was trained with (`text_encoder=...`)",
            )
    else:
        inner = cfg.num_attention_heads * cfg.attention_head_dim
        transformer = PixArtTransformer2DModel(
            num_attention_heads=cfg.num_attention_heads,
            attention_head_dim=cfg.attention_head_dim,
            in_channels=in_channels,
            out_channels=in_channels * (2 if cfg.learned_sigma else 1),
            num_layers=cfg.num_layers,
            dropout=cfg.dropout,
            cross_attention_dim=cfg.cross_attention_dim or inner,
            sample_size=sample_size,
            patch_size=cfg.patch_size,
            caption_channels=caption_channels,
            use_additional_conditions=False,
        )
    if sample_size % transformer.config.patch_size:
        raise ConfigError(
            "model.patch_size",
            transformer.config.patch_size,
            f"the latent size {sample_size} must be divisible by it",
            "pick a patch size that divides the latent size, or change `data.resolution`",
        )
    return DiTAdapter(transformer.train())
