"""The class-conditional DiT of Peebles & Xie (facebookresearch/DiT): diffusers' ``DiTTransformer2DModel``.

Its condition is a class id per image (``text_encoder.kind=class_labels``), embedded by a label table with one more
row, the null class, for classifier-free guidance. The table's own random label dropout is switched off: dropout is
the trainer's (``data.caption_dropout`` -> the null class), drawn from the run's generator so a resumed run draws
exactly what the uninterrupted one would. An export is a ``DiTPipeline`` folder; the class names are in the
manifest (``DiTPipeline`` takes class ids).
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import DiTPipeline, DiTTransformer2DModel
from diffusers.models.embeddings import LabelEmbedding

from dit_trainer.components.families.base import ExportParts, Family, PipelineExport, architecture, input_mismatch
from dit_trainer.config import ModelConfig, TrainConfig
from dit_trainer.errors import require

DIT_PIPELINE_CLASSES = 1000  # DiTPipeline's null class id is 1000: ImageNet's class count


def check(cfg: TrainConfig) -> None:
    require(
        not cfg.privacy.enabled or cfg.privacy.mode != "ghost",
        "privacy.mode",
        cfg.privacy.mode,
        "Opacus' ghost clipping refuses DiTTransformer2DModel (it reports parameter tying)",
        "use `privacy.mode=hooks` (per-sample gradients from hooks: more memory, the same guarantee)",
    )


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


def export(parts: ExportParts) -> PipelineExport:
    """A ``DiTPipeline`` folder. The manifest lists the classes (id = position; the null class, CFG's
    unconditional branch, is the next id). ``DiTPipeline`` takes class 1000 as the null class, so its guidance matches
    ours only for 1,000-class models; with other class counts it generates as ours does at ``guidance_scale=1``."""
    cfg = parts.cfg
    classes = cfg.text_encoder.classes
    guidance = cfg.diffusion.guidance_scale if len(classes) == DIT_PIPELINE_CLASSES else 1.0
    generation = {"num_inference_steps": cfg.diffusion.sample_steps, "guidance_scale": guidance}
    manifest = {"classes": {"names": classes, "null_class": len(classes)}, "generation": generation}

    def save(folder: Path) -> None:
        DiTPipeline(transformer=parts.transformer, vae=parts.vae, scheduler=parts.scheduler).save_pretrained(folder)

    def usage(folder: str) -> str:
        return (
            f"from diffusers import DiTPipeline\n\npipe = DiTPipeline.from_pretrained({folder!r})\n"
            f"image = pipe(class_labels=[0], num_inference_steps={generation['num_inference_steps']}, "
            f"guidance_scale={generation['guidance_scale']}).images[0]  # class 0: {classes[0]!r}"
        )

    return PipelineExport(True, manifest, save, usage)


DIT = Family(
    transformer_class=DiTTransformer2DModel,
    build=build,
    mismatch=mismatch,
    predict=predict,
    pipeline="DiTPipeline",
    export=export,
    check=check,
    prepare=prepare,
    condition="class",
)
