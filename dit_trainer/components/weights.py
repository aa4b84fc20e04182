"""The trained weights of a checkpoint written and read back: a whole diffusers transformer, or a LoRA run's
adapter in peft's format (where in a checkpoint each goes is the run folder's ``WeightsLayout``)."""

from __future__ import annotations

from pathlib import Path

from diffusers import ModelMixin

from dit_trainer.components.dit import load_trained_transformer
from dit_trainer.components.lora import load_adapter, save_adapter


def save_weights(transformer: ModelMixin, path: Path, lora: bool) -> None:
    if lora:
        save_adapter(transformer, path)
    else:
        transformer.save_pretrained(path)


def load_weights(transformer: ModelMixin, path: Path, lora: bool) -> None:
    """Into ``transformer`` in place; whole weights from safetensors only (``load_trained_transformer``)."""
    if lora:
        load_adapter(transformer, path)
    else:
        transformer.load_state_dict(load_trained_transformer(path, type(transformer)).state_dict())
