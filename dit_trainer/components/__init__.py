"""The three components behind one call signature each: frozen VAE, frozen text encoder, trainable DiT."""

from dit_trainer.components.dit import DiTAdapter, build_dit, enable_gradient_checkpointing, load_transformer
from dit_trainer.components.freeze import freeze, trainable_parameters
from dit_trainer.components.modulation import expose_modulation_tables
from dit_trainer.components.text_encoder import FrozenTextEncoder, build_text_encoder
from dit_trainer.components.vae import FrozenVAE, PixelVAE, build_vae

__all__ = [
    "DiTAdapter",
    "FrozenTextEncoder",
    "FrozenVAE",
    "PixelVAE",
    "build_dit",
    "build_text_encoder",
    "build_vae",
    "enable_gradient_checkpointing",
    "expose_modulation_tables",
    "freeze",
    "load_transformer",
    "trainable_parameters",
]
