"""PixArt-α and PixArt-Σ: ``PixArtTransformer2DModel``, conditioned on text features by cross-attention.

The two share the transformer class and this module; they differ in their released weights (Σ: the SDXL VAE, 300
T5 tokens, no micro-conditions) and in the pipeline an export writes.

An export is a whole pipeline folder (``transformer/``, ``vae/``, ``text_encoder/``, ``tokenizer/``, ``scheduler/``,
``model_index.json``) with the run's own text encoder, whatever it is: the PixArt pipelines only call
``text_encoder(input_ids, attention_mask=mask)[0]``, the last hidden state our conditioner gives, so a T5, the
shapes default's MiniLM (BERT) or a CLIP text model all load with ``DiffusionPipeline.from_pretrained(folder)`` (which
logs that it expected a T5) and generate what our sampler does. The transformer's ``sample_size`` is the trained
latent size, so the default height and width are the trained size; the pipelines' resolution binning knows only
PixArt's own sizes (256, 512, 1024 px; Sigma 2048 too) and raises "Invalid sample size" at others, which the folder
cannot change: the manifest's ``required`` names ``use_resolution_binning=False`` then (and anything else
``pipe(prompt)`` needs), and its ``usage`` passes it.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import diffusers
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, PixArtTransformer2DModel

from dit_trainer.components.conditioners.text_encoder import FrozenTextEncoder
from dit_trainer.components.families.base import (
    FEED_FORWARD_ACTIVATIONS,
    ExportParts,
    Family,
    PipelineExport,
    architecture,
    cross_attention_prediction,
    features_mismatch,
    input_mismatch,
    named_text_encoder,
    rebuilt,
    require_extra_at_least,
    require_extra_one_of,
    require_further_arguments,
    require_inner_cross_attention,
    save_with_encoder,
)
from dit_trainer.components.modulation import expose_modulation_tables
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, DataConfig, DiffusionConfig, ModelConfig
from dit_trainer.errors import ConfigError

# The constructor arguments `model.*`, the VAE and the conditioner decide (and num_embeds_ada_norm, which
# ada_norm_single does not use but needs set); `model.extra_config` may give the others.
DERIVED = frozenset(
    {"num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "num_layers", "dropout",
     "sample_size", "patch_size", "cross_attention_dim", "caption_channels", "use_additional_conditions",
     "num_embeds_ada_norm"}
)  # fmt: skip
# The sample sizes the pipelines' resolution binning knows (its aspect-ratio tables); others: "Invalid sample size".
BINNED_SAMPLE_SIZES = {"PixArtAlphaPipeline": (32, 64, 128), "PixArtSigmaPipeline": (32, 64, 128, 256)}
# The PixArt pipelines predate flow matching: they scale the first latents by the scheduler's ``init_noise_sigma`` and
# call ``scale_model_input``, which FlowMatchEulerDiscreteScheduler lacks (a method: no folder can supply it). For flow
# matching both are the identity, so the printed recipe supplies them (the pipeline then reproduces our sampler).
FLOW_MATCHING_PATCH = (
    "# The PixArt pipelines predate flow matching: give the scheduler the two identity members they expect\n"
    "pipe.scheduler.init_noise_sigma = 1.0\n"
    "pipe.scheduler.scale_model_input = lambda sample, timestep=None: sample\n"
)


def check(model: ModelConfig) -> None:
    """PixArt's caption projection maps text features to the inner size, so a built one has no other;
    ``model.extra_config`` gives the class's other arguments (values it builds with)."""
    m = model
    if m.pretrained is not None:
        return
    require_inner_cross_attention(m, "PixArt's caption projection maps text features to its cross-attention's width,")
    require_further_arguments(m, PixArtTransformer2DModel, DERIVED)
    require_extra_one_of(m, "norm_type", ("ada_norm_single",), "PixArtTransformer2DModel")
    require_extra_one_of(m, "attention_type", ("default",), "PixArt's predict (no GLIGEN inputs)")
    require_extra_one_of(m, "activation_fn", FEED_FORWARD_ACTIVATIONS, "diffusers' FeedForward")
    require_extra_at_least(m, "interpolation_scale", 1, "the positional embedding's scale (null: sample_size / 64)")


def build(cfg: ModelConfig, in_channels: int, sample_size: int, condition: ConditionSize) -> PixArtTransformer2DModel:
    return PixArtTransformer2DModel(
        **architecture(cfg, in_channels, sample_size),
        cross_attention_dim=cfg.cross_attention_dim or cfg.num_attention_heads * cfg.attention_head_dim,
        caption_channels=condition.sequence,
        use_additional_conditions=False,
        **cfg.extra_config,
    )


def mismatch(config: dict, in_channels: int, condition: ConditionSize) -> str | None:
    return features_mismatch(config, "caption_channels", condition.sequence) or input_mismatch(config, in_channels)


def predict(
    transformer: PixArtTransformer2DModel,
    x_t: torch.Tensor,
    t: torch.Tensor,
    condition: Condition,
) -> torch.Tensor:
    """PixArt-α at 1024 px conditions on the image's pixel size and aspect ratio (``added_cond_kwargs``): the size
    of ``x_t`` (a bucket's, with buckets) x the SD VAE's factor 8 its weights were trained with."""
    added_cond_kwargs = {"resolution": None, "aspect_ratio": None}
    if transformer.config.use_additional_conditions:
        height, width = (size * 8 for size in x_t.shape[-2:])
        batch = x_t.shape[0]
        added_cond_kwargs = {
            "resolution": torch.tensor([[height, width]], device=x_t.device, dtype=x_t.dtype).repeat(batch, 1),
            "aspect_ratio": torch.tensor([[height / width]], device=x_t.device, dtype=x_t.dtype).repeat(batch, 1),
        }
    return cross_attention_prediction(
        transformer, x_t, t.expand(x_t.shape[0]), condition, added_cond_kwargs=added_cond_kwargs
    )


def _at_trained_size(transformer: PixArtTransformer2DModel, latent_size: int) -> PixArtTransformer2DModel:
    """``transformer`` with ``sample_size`` = the latent size it was trained at, so that the pipeline's default height
    and width (``sample_size`` x the VAE's factor) are the trained size. The positional table is unchanged: it is the
    sin-cos grid ``arange(tokens) / (tokens / base_size) / interpolation_scale`` with ``base_size`` = sample_size /
    patch_size, so ``interpolation_scale`` is rescaled with ``sample_size``. A transformer that conditions on the image
    size (PixArt-alpha 1024's micro-conditions, which the pipeline passes only at sample_size 128) is kept as it is."""
    config = transformer.config
    if config.sample_size == latent_size or transformer.use_additional_conditions:
        return transformer
    scale = config.interpolation_scale or max(config.sample_size // 64, 1)
    return rebuilt(
        transformer,
        sample_size=latent_size,
        interpolation_scale=scale * latent_size / config.sample_size,
        use_additional_conditions=False,
    )


def _required(
    parts: ExportParts, pipeline_class: type, transformer: PixArtTransformer2DModel, model: torch.nn.Module
) -> dict:
    """The arguments ``pipe(prompt)`` needs beyond its defaults to generate at the trained size, each because the
    pipeline hard-codes something the folder cannot set: its resolution binning knows only PixArt's own sample sizes
    (else "Invalid sample size"), and its default height and width are ``sample_size`` x 2^(VAE levels - 1)."""
    resolution, sample_size = parts.data.resolution, transformer.config.sample_size
    required = {}
    default_size = sample_size * 2 ** (len(parts.vae.config.block_out_channels) - 1)
    if sample_size not in BINNED_SAMPLE_SIZES[parts.pipeline] or default_size != resolution:
        required["use_resolution_binning"] = False  # (binning maps any other size to one of PixArt's)
    if default_size != resolution:
        required |= {"height": resolution, "width": resolution}
    positions = getattr(model.config, "max_position_embeddings", None)  # CLIP's 77, BERT's 512; T5: relative
    default_length = inspect.signature(pipeline_class.__call__).parameters["max_sequence_length"].default
    if positions is not None and positions < default_length:
        required["max_sequence_length"] = parts.conditioner.max_length
    return required


def _generation(conditioner: ConditionerConfig, data: DataConfig, diffusion: DiffusionConfig, required: dict) -> dict:
    """The pipeline call that reproduces our sampler (``latents=`` for the same noise)."""
    return {
        "height": data.resolution,
        "width": data.resolution,
        "num_inference_steps": diffusion.sample_steps,
        "guidance_scale": diffusion.guidance_scale,
        "negative_prompt": "",
        "max_sequence_length": conditioner.max_length,
        "clean_caption": False,
        **required,
    }


def _usage(folder: str, parts: ExportParts, generation: dict, required: dict) -> str:
    """Python that loads the export in ``folder`` and generates an image as our sampler would: the required
    arguments, and the run's steps, guidance and token count (the pipeline's defaults are 20, 4.5 and 120 or 300)."""
    keys = ("num_inference_steps", "guidance_scale", "max_sequence_length", "clean_caption", *required)
    settings = ", ".join(f"{key}={generation[key]!r}" for key in dict.fromkeys(keys))
    patch = FLOW_MATCHING_PATCH if isinstance(parts.scheduler, FlowMatchEulerDiscreteScheduler) else ""
    cast = parts.dtype != "float32"
    imports, torch_dtype = ("import torch\n", f", torch_dtype=torch.{parts.dtype}") if cast else ("", "")
    return (
        f"{imports}from diffusers import {parts.pipeline}\n\n"
        f"pipe = {parts.pipeline}.from_pretrained({folder!r}{torch_dtype})  # or DiffusionPipeline.from_pretrained\n"
        f'{patch}image = pipe("a red circle", {settings}).images[0]'
    )


def export(parts: ExportParts) -> PipelineExport:
    """A whole pipeline folder with the run's text encoder and tokenizer in it (see the module)."""
    conditioner = parts.text_encoder
    if not isinstance(conditioner, FrozenTextEncoder):
        raise ConfigError(
            "conditioner.kind",
            parts.conditioner.kind,
            f"a PixArt export hands {parts.pipeline} one transformers text encoder and its tokenizer, and this "
            "conditioner is not one",
            "train PixArt with one text encoder (`conditioner.kind=auto`, `t5` or `clip`) to export it",
        )
    pipeline_class = getattr(diffusers, parts.pipeline)
    transformer = _at_trained_size(parts.transformer, parts.latent_shape[-1])
    required = _required(parts, pipeline_class, transformer, conditioner.model)
    generation = _generation(parts.conditioner, parts.data, parts.diffusion, required)
    te = parts.conditioner
    manifest = {
        "text_encoder": {
            **named_text_encoder(te, conditioner.model),
            "conditioning": "last_hidden_state and attention_mask of the prompt tokenized with "
            "padding='max_length', truncation=True, max_length=max_length (the pipeline's encode_prompt, which "
            "lower-cases the prompt first); the empty prompt '' is the unconditional branch of classifier-free "
            "guidance",
        },
        "generation": generation,
        "required": required,  # what pipe(prompt) needs beyond its defaults to generate at the trained size
    }
    if isinstance(parts.scheduler, FlowMatchEulerDiscreteScheduler):
        manifest["scheduler_patch"] = FLOW_MATCHING_PATCH  # run on the loaded pipeline before calling it
    exported = dataclasses.replace(parts, transformer=transformer)

    def save(folder: Path) -> None:
        save_with_encoder(exported, pipeline_class, conditioner.tokenizer, conditioner.model, folder)

    return PipelineExport(True, manifest, save, lambda folder: _usage(folder, parts, generation, required))


def _family(pipeline: str) -> Family:
    return Family(
        transformer_class=PixArtTransformer2DModel,
        build=build,
        mismatch=mismatch,
        predict=predict,
        pipeline=pipeline,
        export=export,
        check=check,
        prepare_private=expose_modulation_tables,
    )


PIXART_ALPHA = _family("PixArtAlphaPipeline")
PIXART_SIGMA = _family("PixArtSigmaPipeline")
