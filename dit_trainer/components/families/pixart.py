"""PixArt-α and PixArt-Σ: ``PixArtTransformer2DModel``, conditioned on text features by cross-attention.

The two share the transformer class and this module; they differ in their released weights (Σ: the SDXL VAE, 300
T5 tokens, no micro-conditions) and in the pipeline an export writes.

An export is a whole pipeline folder when the run's text encoder is a T5 (what the PixArt pipelines load); with
another text encoder (the shapes default's MiniLM/BERT, CLIP) the folder holds ``transformer/``, ``vae/`` and
``scheduler/``, and the manifest names the text encoder: the PixArt pipelines only call
``text_encoder(input_ids, attention_mask=mask)[0]``, the last hidden state our text encoder conditions on, so the
pieces assemble into the same pipeline class (the manifest's ``usage`` shows how).
"""

from __future__ import annotations

from pathlib import Path

import diffusers
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, PixArtTransformer2DModel
from transformers import T5EncoderModel

from dit_trainer.components.families.base import (
    FEED_FORWARD_ACTIVATIONS,
    ExportParts,
    Family,
    PipelineExport,
    architecture,
    cross_attention_prediction,
    features_mismatch,
    input_mismatch,
    loading_args,
    named_text_encoder,
    require_extra_at_least,
    require_extra_one_of,
    require_further_arguments,
    require_inner_cross_attention,
    save_pieces,
    save_with_encoder,
)
from dit_trainer.components.modulation import expose_modulation_tables
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ModelConfig, TrainConfig

# The constructor arguments `model.*`, the VAE and the conditioner decide (and num_embeds_ada_norm, which
# ada_norm_single does not use but needs set); `model.extra_config` may give the others.
DERIVED = frozenset(
    {"num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "num_layers", "dropout",
     "sample_size", "patch_size", "cross_attention_dim", "caption_channels", "use_additional_conditions",
     "num_embeds_ada_norm"}
)  # fmt: skip
# The PixArt pipelines predate flow matching: they scale the first latents by the scheduler's ``init_noise_sigma`` and
# call ``scale_model_input``, which FlowMatchEulerDiscreteScheduler lacks. For flow matching both are the identity,
# so the printed recipe supplies them (the exported pipeline then reproduces our sampler).
FLOW_MATCHING_PATCH = (
    "# The PixArt pipelines predate flow matching: give the scheduler the two identity members they expect\n"
    "pipe.scheduler.init_noise_sigma = 1.0\n"
    "pipe.scheduler.scale_model_input = lambda sample, timestep=None: sample\n"
)


def check(cfg: TrainConfig) -> None:
    """PixArt's caption projection maps text features to the inner size, so a built one has no other;
    ``model.extra_config`` gives the class's other arguments (values it builds with)."""
    m = cfg.model
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


def _conditioning(cfg: TrainConfig, text_encoder, bundled: bool) -> dict:
    """The manifest's text encoder (bundled in the folder, or named) and the pipeline call that reproduces our
    sampler."""
    te = cfg.text_encoder
    return {
        "text_encoder": {
            **named_text_encoder(te, text_encoder.model, bundled),
            "conditioning": "last_hidden_state and attention_mask of the prompt tokenized with "
            "padding='max_length', truncation=True, max_length=max_length; the empty prompt '' is the "
            "unconditional branch of classifier-free guidance",
        },
        "generation": {
            "height": cfg.data.resolution,
            "width": cfg.data.resolution,
            "num_inference_steps": cfg.diffusion.sample_steps,
            "guidance_scale": cfg.diffusion.guidance_scale,
            "negative_prompt": "",
            "max_sequence_length": te.max_length,
            "use_resolution_binning": False,
            "clean_caption": False,
        },
    }


def _usage(folder: str, parts: ExportParts, generation: dict, text_encoder_class: str | None) -> str:
    """Python that loads the export in ``folder`` and generates an image as our sampler would."""
    pipeline, scheduler = parts.pipeline, type(parts.scheduler).__name__
    patch = FLOW_MATCHING_PATCH if isinstance(parts.scheduler, FlowMatchEulerDiscreteScheduler) else ""
    call = patch + (
        f'image = pipe("a red circle", height={generation["height"]}, width={generation["width"]}, '
        f"num_inference_steps={generation['num_inference_steps']}, guidance_scale={generation['guidance_scale']},\n"
        f"             max_sequence_length={generation['max_sequence_length']}, use_resolution_binning=False, "
        "clean_caption=False).images[0]"
    )
    cast = parts.dtype != "float32"
    imports, to_dtype = ("import torch\n", f".to(torch.{parts.dtype})") if cast else ("", "")
    torch_dtype = f", torch_dtype=torch.{parts.dtype}" if cast else ""
    if text_encoder_class is None:
        return (
            f"{imports}from diffusers import {pipeline}\n\npipe = {pipeline}.from_pretrained({folder!r}{torch_dtype})\n"
            + call
        )
    te = parts.cfg.text_encoder
    transformer = type(parts.transformer).__name__
    return (
        f"{imports}from diffusers import AutoencoderKL, {scheduler}, {pipeline}, "
        f"{transformer}\nfrom transformers import AutoTokenizer, {text_encoder_class}\n\n"
        f"folder, text_encoder = {folder!r}, {te.pretrained!r}\n"
        f"pipe = {pipeline}(\n"
        f"    tokenizer=AutoTokenizer.from_pretrained(text_encoder{loading_args(te, te.tokenizer_subfolder)}),\n"
        f"    text_encoder={text_encoder_class}.from_pretrained(text_encoder{loading_args(te, te.subfolder)}),\n"
        f'    transformer={transformer}.from_pretrained(folder, subfolder="transformer"),\n'
        '    vae=AutoencoderKL.from_pretrained(folder, subfolder="vae"),\n'
        f'    scheduler={scheduler}.from_pretrained(folder, subfolder="scheduler"),\n'
        f"){to_dtype}\n{call}"
    )


def export(parts: ExportParts) -> PipelineExport:
    """A whole pipeline folder with a T5 text encoder (the PixArt pipelines' own), else the pieces and the text
    encoder named in the manifest."""
    text_encoder = parts.text_encoder
    bundled = isinstance(text_encoder.model, T5EncoderModel)
    manifest = _conditioning(parts.cfg, text_encoder, bundled)
    text_encoder_class = None if bundled else type(text_encoder.model).__name__

    def save(folder: Path) -> None:
        if bundled:
            pipeline = getattr(diffusers, parts.pipeline)
            save_with_encoder(parts, pipeline, text_encoder.tokenizer, text_encoder.model, folder)
        else:
            save_pieces(parts, folder)

    return PipelineExport(
        bundled, manifest, save, lambda folder: _usage(folder, parts, manifest["generation"], text_encoder_class)
    )


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
