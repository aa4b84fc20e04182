"""The class-conditional DiT of Peebles & Xie (facebookresearch/DiT): diffusers' ``DiTTransformer2DModel``.

Its condition is a class id per image (``text_encoder.kind=class_labels``), embedded by a label table with one more
row, the null class, for classifier-free guidance. The table's own random label dropout is switched off: dropout is
the trainer's (``data.caption_dropout`` -> the null class), drawn from the run's generator so a resumed run draws
exactly what the uninterrupted one would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from diffusers import DiTTransformer2DModel
from diffusers.models.embeddings import LabelEmbedding

from dit_trainer.components.families.base import Family, architecture, input_mismatch

if TYPE_CHECKING:
    from dit_trainer.config import ModelConfig


def prepare(transformer: DiTTransformer2DModel) -> None:
    for module in transformer.modules():
        if isinstance(module, LabelEmbedding):
            module.dropout_prob = 0.0  # its null-class row stays: the table was sized with dropout on


def build(cfg: ModelConfig, in_channels: int, sample_size: int, num_classes: int) -> DiTTransformer2DModel:
    return DiTTransformer2DModel(**architecture(cfg, in_channels, sample_size), num_embeds_ada_norm=num_classes)


def mismatch(config: dict, in_channels: int, num_classes: int) -> str | None:
    if config["num_embeds_ada_norm"] != num_classes:
        return f"it has {config['num_embeds_ada_norm']} classes while `text_encoder.classes` lists {num_classes}"
    return input_mismatch(config, in_channels)


def predict(
    transformer: DiTTransformer2DModel,
    x_t: torch.Tensor,
    t: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    return transformer(x_t, timestep=t.expand(x_t.shape[0]), class_labels=labels, return_dict=False)[0][
        :, : x_t.shape[1]
    ]


DIT = Family(DiTTransformer2DModel, build, mismatch, predict, "DiTPipeline", prepare=prepare, condition="class")
