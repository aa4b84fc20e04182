"""The three components behind one call signature each: frozen VAE, frozen text encoder, trainable DiT; and
``build_components``, which builds them (and the noise schedule) from a run's config."""

from dit_trainer.components.build import Components, build_components
from dit_trainer.components.dit import (
    DiTAdapter,
    build_dit,
    enable_gradient_checkpointing,
    load_trained_transformer,
    load_transformer,
)
from dit_trainer.components.freeze import freeze, trainable_parameters
from dit_trainer.components.lora import apply_lora, load_adapter, merge_adapter, save_adapter
from dit_trainer.components.modulation import expose_modulation_tables
from dit_trainer.components.text_encoder import TEXT_ENCODER_KINDS, FrozenTextEncoder, build_text_encoder
from dit_trainer.components.vae import VAE_KINDS, FrozenVAE, PixelVAE, build_vae

__all__ = [
    "TEXT_ENCODER_KINDS",
    "VAE_KINDS",
    "Components",
    "DiTAdapter",
    "FrozenTextEncoder",
    "FrozenVAE",
    "PixelVAE",
    "apply_lora",
    "build_components",
    "build_dit",
    "build_text_encoder",
    "build_vae",
    "enable_gradient_checkpointing",
    "expose_modulation_tables",
    "freeze",
    "load_adapter",
    "load_trained_transformer",
    "load_transformer",
    "merge_adapter",
    "save_adapter",
    "trainable_parameters",
]
