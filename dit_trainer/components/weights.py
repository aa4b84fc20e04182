"""The trained weights of a checkpoint written and read back: a whole diffusers transformer, or a LoRA run's
adapter in peft's format (where in a checkpoint each goes is the run folder's ``WeightsLayout``)."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import ModelMixin

from dit_trainer.components.dit import load_trained_transformer
from dit_trainer.components.lora import load_adapter, save_adapter
from dit_trainer.sharding import gathered_state_dict, is_sharded


def save_weights(transformer: ModelMixin, path: Path, lora: bool) -> None:
    """``transformer``'s weights into ``path``. Sharded (FSDP2) weights are gathered first: then every process must
    call this, and the main one (which receives the whole state) writes."""
    if not is_sharded(transformer.parameters()):
        if lora:
            save_adapter(transformer, path)
        else:
            transformer.save_pretrained(path)
        return
    state = gathered_state_dict(transformer)
    if not state:  # not the main process
        return
    if lora:
        save_adapter(transformer, path, state)
    else:
        stand_in(transformer, state).save_pretrained(path)


def stand_in(transformer: ModelMixin, state: dict[str, torch.Tensor]) -> ModelMixin:
    """A model of ``transformer``'s class and config holding ``state``: diffusers' ``save_pretrained`` (its file
    names, shards and index) takes no state dict, so the gathered weights are given a model of their own, built on
    the meta device at no cost and then handed the tensors themselves."""
    with torch.device("meta"):
        copy = type(transformer).from_config(transformer.config)
    copy.load_state_dict(state, assign=True)
    return copy


def load_weights(transformer: ModelMixin, path: Path, lora: bool) -> None:
    """Into ``transformer`` in place; whole weights from safetensors only (``load_trained_transformer``)."""
    if lora:
        load_adapter(transformer, path)
    else:
        transformer.load_state_dict(load_trained_transformer(path, type(transformer)).state_dict())
