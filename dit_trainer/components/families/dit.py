"""The class-conditional DiT of Peebles & Xie (facebookresearch/DiT): diffusers' ``DiTTransformer2DModel`` with one
timestep-and-label embedder shared by every block, as the paper's model has.

diffusers gives each block its own embedder (``transformer_blocks.i.norm1.emb``): DiT-XL/2 then trains 749,826,464
parameters and 28 label tables where the paper's has 674,834,720 trained (675,129,632 with the fixed sin-cos position
table the DiT repository counts as a frozen parameter) and one. A new model shares block 0's embedder; its state dict
keeps diffusers' layout (every block's keys, equal values), so checkpoints and exports load in ``DiTPipeline``, and
weights in that layout whose blocks hold one embedder are shared again when loaded. Weights whose blocks' embedders
differ (a DiT trained with diffusers' layout) load as they are, unshared. Under FSDP2 the embedder (``shared``: block
0's, which the output layer calls too) is a unit of its own: inside block 0's it would be sharded for every other call.

Its condition is a class id per image (``conditioner.kind=class_labels``), embedded by a label table with one more
row, the null class, for classifier-free guidance. The table's own random label dropout is switched off: dropout is
the trainer's (``data.caption_dropout`` -> the null class), drawn from the run's generator so a resumed run draws
exactly what the uninterrupted one would. An export is a ``DiTPipeline`` folder that knows the class names
(``pipe.get_label_ids``) and whose null class is ours, so its guidance is ours (``with_pipeline_null_class``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import DiTPipeline, DiTTransformer2DModel
from diffusers.models.embeddings import LabelEmbedding

from dit_trainer.components.families.base import (
    FEED_FORWARD_ACTIVATIONS,
    ExportParts,
    Family,
    PipelineExport,
    architecture,
    input_mismatch,
    rebuilt,
    require_extra_one_of,
    require_further_arguments,
)
from dit_trainer.components.modulation import embed_once_per_forward
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ModelConfig
from dit_trainer.errors import ConfigError

DIT_PIPELINE_CLASSES = 1000  # DiTPipeline's null class id is 1000 (hard-coded): ImageNet's class count
# The constructor arguments `model.*`, the VAE and the class list decide; `model.extra_config` may give the others.
DERIVED = frozenset(
    {"num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "num_layers", "dropout",
     "sample_size", "patch_size", "num_embeds_ada_norm"}
)  # fmt: skip


def embed_once_under_privacy(transformer: DiTTransformer2DModel) -> int:
    """DP-SGD: the embedder, which every block and the output layer call on the same inputs, computes its output once
    per forward (``components.modulation.embed_once_per_forward``), so that Opacus' per-sample gradients of it (ghost
    clipping's norms, or the hooks' gradients) are those of the whole forward. Unshared embedders (weights in
    diffusers' layout) too: block 0's is called again by the output layer."""
    return embed_once_per_forward(transformer, [block.norm1.emb for block in transformer.transformer_blocks])


def check(model: ModelConfig) -> None:
    if model.pretrained is None:
        require_further_arguments(model, DiTTransformer2DModel, DERIVED)
        require_extra_one_of(model, "norm_type", ("ada_norm_zero",), "DiTTransformer2DModel")
        require_extra_one_of(model, "activation_fn", FEED_FORWARD_ACTIVATIONS, "diffusers' FeedForward")


def embedder_keys(transformer: DiTTransformer2DModel, block: int, prefix: str = "") -> list[str]:
    """The state-dict keys of block ``block``'s timestep-and-label embedder."""
    names = [name for name, _ in transformer.transformer_blocks[0].norm1.emb.named_parameters()]
    return [f"{prefix}transformer_blocks.{block}.norm1.emb.{name}" for name in names]


def shares_one_embedder(transformer: DiTTransformer2DModel) -> bool:
    first = transformer.transformer_blocks[0].norm1.emb
    return all(block.norm1.emb is first for block in transformer.transformer_blocks)


def share_the_embedder(transformer: DiTTransformer2DModel) -> None:
    """Every block conditions on block 0's embedder (the model's output layer already does)."""
    if shares_one_embedder(transformer):
        return
    first = transformer.transformer_blocks[0].norm1.emb
    for block in transformer.transformer_blocks[1:]:
        block.norm1.emb = first
    transformer.register_state_dict_post_hook(_with_every_blocks_embedder)
    transformer.register_load_state_dict_pre_hook(_refuse_unshared_embedders)


def _with_every_blocks_embedder(transformer: DiTTransformer2DModel, state: dict, prefix: str, metadata) -> None:
    """Each block's entries get their own copy: safetensors refuses tensors that share memory, and a copy is
    diffusers' layout, which ``DiTPipeline`` loads. (``keep_vars`` state dicts keep the shared parameter.)"""
    for block in range(1, len(transformer.transformer_blocks)):
        for key in embedder_keys(transformer, block, prefix):
            if not isinstance(state[key], torch.nn.Parameter):
                state[key] = state[key].clone()


def _refuse_unshared_embedders(transformer: DiTTransformer2DModel, state: dict, prefix: str, *args) -> None:
    """Loading different embedders into the shared one would keep the last block's and silently change the model."""
    first = [state.get(key) for key in embedder_keys(transformer, 0, prefix)]
    for block in range(1, len(transformer.transformer_blocks)):
        for key, reference in zip(embedder_keys(transformer, block, prefix), first):
            if key in state and reference is not None and not torch.equal(state[key], reference):
                raise ConfigError(
                    "model.family",
                    "dit",
                    f"these weights give each block its own timestep and label embedder ({key} differs from block "
                    "0's: diffusers' layout, as dit-trainer trained DiTs before 2026-11-25), while the model built "
                    "here shares one, as the DiT paper's",
                    "load them with `scripts/sample.py` or `scripts/export.py` (which keep their layout), or start "
                    "from them as `model.pretrained=<their transformer folder>` in a fresh run",
                )


def prepare(transformer: DiTTransformer2DModel) -> None:
    for module in transformer.modules():
        if isinstance(module, LabelEmbedding):
            module.dropout_prob = 0.0  # its null-class row stays: the table was sized with dropout on
    first = list(transformer.transformer_blocks[0].norm1.emb.parameters())
    if not shares_one_embedder(transformer) and all(
        torch.equal(parameter, reference)
        for block in transformer.transformer_blocks[1:]
        for parameter, reference in zip(block.norm1.emb.parameters(), first)
    ):  # a shared embedder saved in diffusers' layout (or one model's copies of it)
        share_the_embedder(transformer)


def build(cfg: ModelConfig, in_channels: int, sample_size: int, classes: ConditionSize) -> DiTTransformer2DModel:
    transformer = DiTTransformer2DModel(
        **architecture(cfg, in_channels, sample_size), num_embeds_ada_norm=classes.sequence, **cfg.extra_config
    )
    share_the_embedder(transformer)
    return transformer


def mismatch(config: dict, in_channels: int, classes: ConditionSize) -> str | None:
    num_classes = classes.sequence
    if config["num_embeds_ada_norm"] != num_classes:
        return f"it has {config['num_embeds_ada_norm']} classes while `conditioner.classes` lists {num_classes}"
    return input_mismatch(config, in_channels)


def predict(
    transformer: DiTTransformer2DModel,
    x_t: torch.Tensor,
    t: torch.Tensor,
    condition: Condition,
) -> torch.Tensor:
    labels = condition.sequence
    return transformer(x_t, timestep=t.expand(x_t.shape[0]), class_labels=labels, return_dict=False)[0][
        :, : x_t.shape[1]
    ]


def with_pipeline_null_class(transformer: DiTTransformer2DModel, classes: int) -> DiTTransformer2DModel:
    """``transformer`` with its label tables widened to ``DiTPipeline``'s 1,000 classes, so that the pipeline's null
    class (id 1000, hard-coded) is ours and its classifier-free guidance is ours at any scale: rows 0..N-1 are our
    classes, row 1000 our null class, and the unused rows N..999 copies of it. A model of 1,000 classes or more is
    kept as it is (with more, id 1000 is one of its classes)."""
    if classes >= DIT_PIPELINE_CLASSES:
        return transformer
    state = transformer.state_dict()
    for key in [key for key in state if key.endswith("class_embedder.embedding_table.weight")]:
        table = state[key]
        state[key] = table[classes].repeat(DIT_PIPELINE_CLASSES + 1, 1)
        state[key][:classes] = table[:classes]
    return rebuilt(transformer, state, num_embeds_ada_norm=DIT_PIPELINE_CLASSES)


def export(parts: ExportParts) -> PipelineExport:
    """A ``DiTPipeline`` folder whose ``get_label_ids`` knows the class names (``id2label`` in ``model_index.json``)
    and whose null class is ours (``with_pipeline_null_class``): ``pipe(class_labels=pipe.get_label_ids([name]))``
    generates at the trained size with guidance as ours. The manifest lists the classes (id = position)."""
    classes = parts.conditioner.classes
    transformer = with_pipeline_null_class(parts.transformer, len(classes))
    null_class = max(len(classes), DIT_PIPELINE_CLASSES)
    # With more than 1,000 classes DiTPipeline's null class is one of ours: it matches our sampler without guidance.
    guidance = parts.diffusion.guidance_scale if null_class == DIT_PIPELINE_CLASSES else 1.0
    generation = {"num_inference_steps": parts.diffusion.sample_steps, "guidance_scale": guidance}
    required = {} if guidance == parts.diffusion.guidance_scale else {"guidance_scale": 1.0}
    manifest = {
        "classes": {"names": classes, "null_class": null_class},
        "generation": generation,
        "required": required,
    }

    def save(folder: Path) -> None:
        pipeline = DiTPipeline(transformer=transformer, vae=parts.vae, scheduler=parts.scheduler)
        pipeline.register_to_config(id2label=dict(enumerate(classes)))  # DiTPipeline's init argument for names
        pipeline.save_pretrained(folder)

    def usage(folder: str) -> str:
        settings = ", ".join(f"{key}={value!r}" for key, value in generation.items())
        return (
            f"from diffusers import DiTPipeline\n\npipe = DiTPipeline.from_pretrained({folder!r})\n"
            f"image = pipe(class_labels=pipe.get_label_ids([{classes[0]!r}]), {settings}).images[0]"
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
    prepare_private=embed_once_under_privacy,
    condition="class",
    shared=("transformer_blocks.0.norm1.emb",),  # the embedder every block and the output layer call
)
