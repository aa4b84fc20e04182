"""The interface every transformer family implements (see ``dit_trainer.components.families``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import ModelMixin
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from torch import nn

from dit_trainer.config import ModelConfig, TrainConfig

# The attention projections and feed-forward layers of diffusers' transformer blocks: the usual LoRA targets.
ATTENTION_AND_FEED_FORWARD = ("to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2")


@dataclass(frozen=True)
class ExportParts:
    """What an export assembles a family's pipeline from: the run's config, its models ready to save (``vae`` with
    the latent normalisation folded in), ``pipeline`` (the family's pipeline class name) and the dtype's name."""

    cfg: TrainConfig
    transformer: ModelMixin
    vae: ModelMixin
    scheduler: SchedulerMixin
    text_encoder: nn.Module
    pipeline: str
    dtype: str


@dataclass(frozen=True)
class PipelineExport:
    """A family's export: ``bundled`` (the folder is a whole pipeline, loadable with ``from_pretrained``), the
    manifest entries it adds (conditioning, generation settings), ``save(folder)``, and ``usage(folder)``: Python
    that loads the folder and generates an image as our sampler would."""

    bundled: bool
    manifest: dict
    save: Callable[[Path], None]
    usage: Callable[[str], str]


@dataclass(frozen=True)
class Family:
    """One transformer family.

    ``build(cfg, in_channels, sample_size, condition_dim)``: a new transformer whose input follows the VAE
    (latent channels, latent size) and whose conditioning input follows the text encoder's hidden size (or, for
    class conditioning, the number of classes).
    ``mismatch(config, in_channels, condition_dim)``: why a loaded transformer's config does not fit the run
    (None when it does). ``predict``: the prediction for ``x_t`` at timesteps ``t``, ``x_t``'s channels only (a
    learned-variance half is the family's to drop). ``pipeline``: the diffusers pipeline class an export writes,
    ``export``: how. ``check(cfg)``: the family's own config rules, run before any model is built.
    """

    transformer_class: type[ModelMixin]
    build: Callable[[ModelConfig, int, int, int], ModelMixin]
    mismatch: Callable[[dict, int, int], str | None]
    predict: Callable[[ModelMixin, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    pipeline: str
    export: Callable[[ExportParts], PipelineExport]
    check: Callable[[TrainConfig], None] | None = None
    prepare: Callable[[ModelMixin], None] | None = None  # applied to every built or loaded transformer
    # Applied before DP-SGD's per-sample gradient engine (Opacus) sees the transformer, so that every parameter it
    # trains sits in a module that engine supports; before the optimizer and EMA collect the parameters.
    prepare_private: Callable[[ModelMixin], object] | None = None
    condition: str = "text"  # text: a text encoder's (embeds, mask) | class: class ids (text_encoder.kind=class_labels)
    input_layer: str = "pos_embed.proj"  # the first layer the inputs meet: its dtype is the compute dtype
    lora_targets: tuple[str, ...] = ATTENTION_AND_FEED_FORWARD  # `lora.target_modules` when it is empty


def architecture(cfg: ModelConfig, in_channels: int, sample_size: int) -> dict:
    """The constructor arguments every DiT-style family shares: sizes from ``model.*``, input from the VAE, and
    twice the channels out with a learned variance."""
    return {
        "num_attention_heads": cfg.num_attention_heads,
        "attention_head_dim": cfg.attention_head_dim,
        "in_channels": in_channels,
        "out_channels": in_channels * (2 if cfg.learned_sigma else 1),
        "num_layers": cfg.num_layers,
        "dropout": cfg.dropout,
        "sample_size": sample_size,
        "patch_size": cfg.patch_size,
    }


def input_mismatch(config: dict, in_channels: int) -> str | None:
    """Why a loaded transformer does not take the VAE's latents (None when it does)."""
    if config["in_channels"] != in_channels:
        return f"it takes {config['in_channels']} input channels while the VAE gives {in_channels}"
    return None
