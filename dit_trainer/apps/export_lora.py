"""A LoRA run's adapter alone, written beside its merged export in the file its family's diffusers pipeline reads with
``pipe.load_lora_weights(folder)``: diffusers' LoRA format, ``pytorch_lora_weights.safetensors`` whose keys are the
transformer's peft keys under ``transformer.``, with peft's ``LoraConfig`` in its ``lora_adapter_metadata`` so that
the rank and alpha travel with it. The merged weights are for generating; this file applies the fine-tune to the base
model's pipeline (and lets it be scaled, combined with other LoRAs, or fused).

SD3's, Flux's and Sana's pipelines have a LoRA loader in diffusers 0.42; PixArt's and DiT's have none (nor do their
transformers take a ``load_lora_adapter``): their adapter stays in the checkpoint, in peft's format, which
``peft.set_peft_model_state_dict`` loads. A run that also trained whole modules (``lora.train_modules``) has weights
diffusers' LoRA format does not hold: its merged export is the result."""

from __future__ import annotations

import os
from pathlib import Path

import diffusers
from diffusers.loaders.lora_base import LORA_WEIGHT_NAME_SAFE
from peft import LoraConfig
from safetensors.torch import load_file

from dit_trainer.components.lora import ADAPTER_WEIGHTS
from dit_trainer.config import LoRAConfig, ModelConfig

LORA_FOLDER = "lora"  # in the export folder


def lora_base(model: ModelConfig, out_dir: Path) -> dict:
    """The transformer the adapter applies to: ``model.pretrained`` (a local folder relative to the export folder, so
    that the pair moves together; a hub id as it is), and the subfolder and revision the run read."""
    m = model
    pretrained = str(m.pretrained)
    if Path(pretrained).expanduser().exists():
        pretrained = os.path.relpath(Path(pretrained).expanduser().resolve(), out_dir.resolve())
    return {"pretrained": pretrained, "subfolder": m.subfolder, "revision": m.revision}


def export_adapter(
    pipeline: str, model: ModelConfig, lora: LoRAConfig, weights: Path, folder: Path, out_dir: Path
) -> dict:
    """Write the adapter in ``weights`` (a checkpoint's peft folder) to ``folder/lora`` where the family's pipeline
    can load it; the manifest's entry: where it is and what it applies to, or why there is none."""
    pipeline_class = getattr(diffusers, pipeline)
    checkpoint_folder = f"the checkpoint's {weights.name}/ (peft's format: adapter_config.json, {ADAPTER_WEIGHTS})"
    if not hasattr(pipeline_class, "load_lora_weights"):
        return {
            "folder": None,
            "why": f"diffusers' {pipeline} has no load_lora_weights; the adapter is in {checkpoint_folder}",
        }
    if lora.train_modules:
        return {
            "folder": None,
            "why": f"the run also trained whole modules ({', '.join(lora.train_modules)}), which diffusers' "
            f"LoRA format does not hold: use the merged weights, or the adapter in {checkpoint_folder}",
        }
    pipeline_class.save_lora_weights(
        folder / LORA_FOLDER,
        transformer_lora_layers=load_file(weights / ADAPTER_WEIGHTS),
        transformer_lora_adapter_metadata=LoraConfig.from_pretrained(str(weights)).to_dict(),
    )
    return {
        "folder": LORA_FOLDER,
        "file": f"{LORA_FOLDER}/{LORA_WEIGHT_NAME_SAFE}",
        "base": lora_base(model, out_dir),
        "usage": f"pipe = {pipeline}.from_pretrained(<the base model's pipeline>); "
        f"pipe.load_lora_weights(<this folder>/{LORA_FOLDER})",
    }
