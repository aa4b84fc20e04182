"""The export of an MMDiT run (SD3: ``StableDiffusion3Pipeline``, Flux: ``FluxPipeline``): a pipeline that generates
what our sampler does. The two pipelines take the same pieces and the same precomputed embeddings, so one function
serves both; the family's ``MMDiT`` names its pipeline, its text components and its CFG argument.

With the family's own encoders (``conditioner.kind=sd3|flux``) the folder is a whole pipeline:
``DiffusionPipeline.from_pretrained(folder)`` takes prompts as text. With another text encoder (MiniLM, mean-pooled)
the pipeline cannot encode a prompt (its ``encode_prompt`` is CLIP's and T5's), so the folder is the pipeline without
text encoders (``model_index.json`` names them null, and ``from_pretrained`` must be told so: ``text_encoder=None``,
...) plus the run's text encoder and tokenizer in ``conditioner/``; the manifest's ``usage`` computes the hidden
states and the pooled vector as our conditioner does and passes them as ``prompt_embeds`` / ``pooled_prompt_embeds``
(and the empty prompt's as the negative ones: our CFG's unconditional branch).

The pipelines' default height and width are ``default_sample_size`` x the VAE's factor: SD3's is the transformer's
``sample_size`` (the trained latent size for a new model), Flux's a fixed 128 (1024 px); where that is not the trained
size the manifest's ``required`` names ``height`` and ``width``.

Both pipelines decode ``latents / scaling_factor + shift_factor``: the family's own VAE (normalised by its
``shift_factor``) is exported as it is; per-channel statistics (the shapes VAE's) are folded into the VAE's
convolutions (``dit_trainer.apps.export``) and the exported ``shift_factor`` is then 0.
"""

from __future__ import annotations

from pathlib import Path

import diffusers
import torch

from dit_trainer.components.families.base import CONDITIONER_FOLDER, ExportParts, PipelineExport, save_text_encoder
from dit_trainer.components.families.mmdit import MMDiT


def _required(pipeline, resolution: int) -> dict:
    """``height`` and ``width`` where the pipeline's default (``default_sample_size`` x its VAE factor) is not the
    trained size: SD3's follows the transformer, Flux's is a fixed 128 latents, which no folder can change."""
    default = pipeline.default_sample_size * pipeline.vae_scale_factor
    return {} if default == resolution else {"height": resolution, "width": resolution}


def _generation(parts: ExportParts, family: MMDiT, guidance: dict, bundled: bool) -> dict:
    """The pipeline's arguments that reproduce our sampler: the family's ``guidance`` (Flux: the embedded one),
    then our CFG scale under the pipeline's name for it."""
    generation = {
        "height": parts.data.resolution,
        "width": parts.data.resolution,
        "num_inference_steps": parts.diffusion.sample_steps,
        **guidance,
        family.cfg_scale: parts.diffusion.guidance_scale,
    }
    if bundled:
        generation |= {"negative_prompt": "", "max_sequence_length": parts.conditioner.max_length}
    return generation


def _conditioning(parts: ExportParts, family: MMDiT, bundled: bool) -> dict:
    if bundled:
        return {"bundled": True, "conditioning": family.own_conditioning}
    te = parts.conditioner
    return {
        "bundled": False,
        "pretrained": f"{CONDITIONER_FOLDER}/text_encoder",  # in the export folder, beside the pipeline's parts
        "tokenizer": f"{CONDITIONER_FOLDER}/tokenizer",
        "class": type(parts.text_encoder.model).__name__,
        "max_length": te.max_length,
        "pooling": te.pooling,
        "conditioning": "prompt_embeds: the last hidden state of the prompt tokenized with padding='max_length', "
        f"truncation=True, max_length=max_length (every token attended, as {family.name} does); pooled_prompt_embeds: "
        + ("its mean over the real tokens" if te.pooling == "mean" else "the model's pooler_output")
        + f"; the empty prompt '' gives the negative ones (classifier-free guidance, {family.cfg_scale})",
    }


def _usage(folder: str, parts: ExportParts, family: MMDiT, generation: dict, bundled: bool) -> str:
    """Python that loads the export in ``folder`` and generates an image as our sampler would."""
    settings = ", ".join(f"{key}={value!r}" for key, value in generation.items())
    pipeline = family.pipeline
    cast = parts.dtype != "float32"
    torch_dtype = f", torch_dtype=torch.{parts.dtype}" if cast else ""
    if bundled:
        imports = "import torch\n" if cast else ""
        return (
            f"{imports}from diffusers import {pipeline}\n\n"
            f"pipe = {pipeline}.from_pretrained({folder!r}{torch_dtype})  # or DiffusionPipeline.from_pretrained\n"
            f'image = pipe("a red circle", {settings}).images[0]'
        )
    te = parts.conditioner
    encoder_class = type(parts.text_encoder.model).__name__
    pooled = "(hidden * mask).sum(1) / mask.sum(1).clamp(min=1)" if te.pooling == "mean" else "output.pooler_output"
    to_dtype = f".to(torch.{parts.dtype})" if cast else ""
    no_encoders = "".join(f"{name}=None, " for name in family.text_parts).rstrip(", ")
    return (
        f"import torch\nfrom diffusers import {pipeline}\n"
        f"from transformers import AutoTokenizer, {encoder_class}\n\n"
        f"folder = {folder!r}\n"
        f'tokenizer = AutoTokenizer.from_pretrained(folder, subfolder="{CONDITIONER_FOLDER}/tokenizer")\n'
        f'encoder = {encoder_class}.from_pretrained(folder, subfolder="{CONDITIONER_FOLDER}/text_encoder").eval()\n'
        "\n\n"
        "@torch.no_grad()\ndef embed(prompts):\n"
        f'    tokens = tokenizer(prompts, padding="max_length", max_length={te.max_length}, truncation=True, '
        'return_tensors="pt")\n'
        "    output = encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask)\n"
        "    hidden = output.last_hidden_state\n"
        "    mask = tokens.attention_mask.unsqueeze(-1).to(hidden.dtype)\n"
        f"    return hidden{to_dtype}, ({pooled}){to_dtype}\n\n\n"
        f"# The pipeline's own text encoders are not in the folder: it takes this run's embeddings\n"
        f"pipe = {pipeline}.from_pretrained(folder, {no_encoders}{torch_dtype})\n"
        'prompt_embeds, pooled_prompt_embeds = embed(["a red circle"])\n'
        'negative_prompt_embeds, negative_pooled_prompt_embeds = embed([""])\n'
        "image = pipe(prompt_embeds=prompt_embeds, pooled_prompt_embeds=pooled_prompt_embeds,\n"
        "             negative_prompt_embeds=negative_prompt_embeds, "
        "negative_pooled_prompt_embeds=negative_pooled_prompt_embeds,\n"
        f"             {settings}).images[0]"
    )


def export(parts: ExportParts, family: MMDiT, guidance: dict | None = None) -> PipelineExport:
    """A whole pipeline folder with the family's own encoders, else the pipeline without text encoders and the run's
    text encoder in ``conditioner/`` (see the module); ``guidance``: generation arguments of the family's own (Flux's
    embedded guidance)."""
    bundled = parts.conditioner.kind == family.kind
    if parts.vae.config.shift_factor is None:  # folded into the weights; the pipeline adds it unconditionally
        parts.vae.register_to_config(shift_factor=0.0)
    dtype = getattr(torch, parts.dtype)
    encoders = {name: None for name in family.text_parts}
    if bundled:
        encoders = {name: getattr(parts.text_encoder, own) for name, own in family.text_parts.items()}
        encoders |= {name: part.to(dtype) for name, part in encoders.items() if name.startswith("text_encoder")}
    pipeline = getattr(diffusers, family.pipeline)(
        transformer=parts.transformer, vae=parts.vae, scheduler=parts.scheduler, **encoders
    )
    required = _required(pipeline, parts.data.resolution)
    generation = _generation(parts, family, guidance or {}, bundled) | required
    manifest = {
        "text_encoder": _conditioning(parts, family, bundled),
        "generation": generation,
        "required": required,  # what the pipeline call needs beyond its defaults to generate at the trained size
    }

    def save(folder: Path) -> None:
        pipeline.save_pretrained(folder)
        if not bundled:
            save_text_encoder(parts, folder / CONDITIONER_FOLDER)

    return PipelineExport(bundled, manifest, save, lambda folder: _usage(folder, parts, family, generation, bundled))
