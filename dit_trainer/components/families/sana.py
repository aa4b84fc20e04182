"""Sana: ``SanaTransformer2DModel`` (linear self-attention, cross-attention to text, a GLUMBConv feed-forward) on the
32x deep-compression autoencoder's latents (``vae.kind=autoencoder_dc``), trained with flow matching.

A new transformer's cross-attention works at the inner size (``heads x head_dim``): its caption projection maps the
conditioner's features (``caption_channels``) there. Its cross-attention heads default to the self-attention's
(``model.extra_config`` may set ``num_cross_attention_heads``/``cross_attention_head_dim``, ``mlp_ratio``,
``qk_norm``, ``interpolation_scale``, ...). Sana has no positional embedding by default, so non-square latents
(buckets) need nothing.

The timestep is passed as ``SanaPipeline`` passes it: the scheduler's ``sigma x 1000`` times the transformer's
``timestep_scale``. An export is a whole ``SanaPipeline`` folder when the run's conditioner is Sana's own Gemma-2
(``text_encoder.kind=sana``); with another text encoder the folder holds ``transformer/``, ``vae/`` and
``scheduler/``, and the manifest's usage computes ``prompt_embeds``/``prompt_attention_mask`` with that encoder and
hands them to the pipeline. ``SanaPipeline`` decodes ``latents / vae.config.scaling_factor`` and an
``AutoencoderDC``'s latents are only scaled by ``FrozenVAE`` (no shift, no per-channel statistics), so the exported
VAE is the run's as it is. (SanaPipeline takes no other autoencoder, so a run on another VAE trains but does not
export.)
"""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import AutoencoderDC, SanaPipeline, SanaTransformer2DModel

from dit_trainer.components.conditioners.sana import SanaConditioner
from dit_trainer.components.families.base import (
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
    require_flow_matching,
    require_further_arguments,
    require_inner_cross_attention,
    save_pieces,
    save_with_encoder,
)
from dit_trainer.components.text_encoder import FrozenTextEncoder
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ModelConfig, TrainConfig
from dit_trainer.errors import ConfigError, require

# Self- and cross-attention projections and the GLUMBConv's 1x1 convolutions (its depthwise 3x3 is grouped per
# channel, which LoRA does not adapt).
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ff.conv_inverted", "ff.conv_point")
# Constructor arguments the family sets from `model.*`, the VAE and the conditioner: not for `model.extra_config`.
SET_HERE = frozenset(
    {"num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "num_layers", "dropout",
     "sample_size", "patch_size", "caption_channels", "cross_attention_dim"}
)  # fmt: skip
# The qk norms diffusers' Attention builds (it raises ValueError on others, after the models load).
QK_NORMS = (None, "rms_norm", "rms_norm_across_heads", "layer_norm", "layer_norm_across_heads", "fp32_layer_norm", "l2")


def check(cfg: TrainConfig) -> None:
    """Flow matching, a cross-attention at the inner size, ``extra_config`` keys the class takes, no guidance
    embedding (that is Sana-Sprint, whose pipeline is another), no DP-SGD (its modulation tables are used inline)."""
    m = cfg.model
    require_flow_matching(
        cfg,
        "Sana is trained with flow matching (its released weights predict the flow velocity)",
        "use `diffusion=flow` (objective flow_matching, FlowMatchEulerDiscreteScheduler)",
    )
    require(
        not cfg.privacy.enabled,
        "privacy.enabled",
        cfg.privacy.enabled,
        "DP-SGD does not support SanaTransformer2DModel yet (its scale-shift tables are used inline, which Opacus' "
        "per-sample gradients cannot see)",
        "set `privacy.enabled=false`, or use a PixArt family for private training",
    )
    if m.pretrained is not None:
        return
    require_further_arguments(m, SanaTransformer2DModel, SET_HERE)
    require_extra_at_least(m, "num_cross_attention_heads", 1, "the number of cross-attention heads")
    require_extra_at_least(m, "cross_attention_head_dim", 1, "the width of a cross-attention head")
    require_extra_at_least(m, "interpolation_scale", 1, "the positional embedding's scale (null: none)")
    require_extra_one_of(m, "qk_norm", QK_NORMS, "Sana's attention (diffusers' Attention)")
    require(
        not m.extra_config.get("guidance_embeds"),
        "model.extra_config",
        dict(m.extra_config),
        "`guidance_embeds` makes a Sana-Sprint transformer, which SanaPipeline (and this family's predict) does not "
        "pass a guidance scale to",
        "remove `guidance_embeds` from `model.extra_config`",
    )
    require_inner_cross_attention(
        m, "Sana's caption projection maps text features to where its cross-attention reads them,"
    )


def build(cfg: ModelConfig, in_channels: int, sample_size: int, condition: ConditionSize) -> SanaTransformer2DModel:
    inner = cfg.num_attention_heads * cfg.attention_head_dim
    return SanaTransformer2DModel(
        **architecture(cfg, in_channels, sample_size),
        caption_channels=condition.sequence,
        cross_attention_dim=inner,
        **{
            "num_cross_attention_heads": cfg.num_attention_heads,
            "cross_attention_head_dim": cfg.attention_head_dim,
            **cfg.extra_config,
        },
    )


def mismatch(config: dict, in_channels: int, condition: ConditionSize) -> str | None:
    if found := features_mismatch(config, "caption_channels", condition.sequence):
        return found
    if config.get("guidance_embeds"):
        return "it embeds a guidance scale (a Sana-Sprint transformer), which SanaPipeline does not pass"
    return input_mismatch(config, in_channels)


def predict(
    transformer: SanaTransformer2DModel, x_t: torch.Tensor, t: torch.Tensor, condition: Condition
) -> torch.Tensor:
    """SanaPipeline's timestep: the scheduler's (sigma x 1000) times the transformer's ``timestep_scale``."""
    return cross_attention_prediction(
        transformer, x_t, t.expand(x_t.shape[0]) * transformer.config.timestep_scale, condition
    )


def _generation(cfg: TrainConfig) -> dict:
    """SanaPipeline's arguments that reproduce our sampler (with the prompt, and ``latents=`` for the same noise)."""
    te, d = cfg.text_encoder, cfg.diffusion
    return {
        "height": cfg.data.resolution,
        "width": cfg.data.resolution,
        "num_inference_steps": d.sample_steps,
        "guidance_scale": d.guidance_scale,
        "negative_prompt": "",
        "max_sequence_length": te.max_length,
        "complex_human_instruction": list(te.instruction) or None,
        "use_resolution_binning": False,
        "clean_caption": False,
    }


def _call(generation: dict, prompt_args: str) -> str:
    keys = ("height", "width", "num_inference_steps", "guidance_scale")
    settings = ", ".join(f"{key}={generation[key]!r}" for key in keys)
    return f"image = pipe({prompt_args}, {settings},\n             use_resolution_binning=False"


def _bundled_usage(folder: str, parts: ExportParts, generation: dict) -> str:
    cast = parts.dtype != "float32"
    imports = "import torch\n" if cast else ""
    torch_dtype = f", torch_dtype=torch.{parts.dtype}" if cast else ""
    instruction = generation["complex_human_instruction"]
    prompt = "\"a red circle\", negative_prompt=''"
    return (
        f"{imports}from diffusers import SanaPipeline\n\n"
        f"pipe = SanaPipeline.from_pretrained({folder!r}{torch_dtype})\n"
        + (f"instruction = {instruction!r}\n" if instruction else "")
        + _call(generation, prompt)
        + f", max_sequence_length={generation['max_sequence_length']},\n"
        + f"             complex_human_instruction={'instruction' if instruction else None}).images[0]"
    )


def _pieces_usage(folder: str, parts: ExportParts, generation: dict) -> str:
    """Prompt embeddings from the run's own text encoder, handed to a SanaPipeline assembled from the pieces."""
    te = parts.cfg.text_encoder
    model_class = type(parts.text_encoder.model).__name__
    cast = f".to(torch.{parts.dtype})" if parts.dtype != "float32" else ""
    embeds = "prompt_embeds=embeds, prompt_attention_mask=mask, negative_prompt=None, negative_prompt_embeds=empty, "
    return (
        "import torch\nfrom diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, "
        f"SanaTransformer2DModel\nfrom transformers import AutoTokenizer, {model_class}\n\n"
        f"folder, text_encoder = {folder!r}, {te.pretrained!r}\n"
        f"tokenizer = AutoTokenizer.from_pretrained(text_encoder{loading_args(te, te.tokenizer_subfolder)})\n"
        f"encoder = {model_class}.from_pretrained(text_encoder{loading_args(te, te.subfolder)}).eval(){cast}\n\n\n"
        "def encode(prompt):\n"
        f"    tokens = tokenizer([prompt], padding='max_length', max_length={te.max_length}, truncation=True, "
        "return_tensors='pt')\n"
        "    with torch.no_grad():\n"
        "        return encoder(tokens.input_ids, attention_mask=tokens.attention_mask)[0], tokens.attention_mask\n\n\n"
        "pipe = SanaPipeline(\n    tokenizer=None,\n    text_encoder=None,\n"
        '    transformer=SanaTransformer2DModel.from_pretrained(folder, subfolder="transformer"),\n'
        '    vae=AutoencoderDC.from_pretrained(folder, subfolder="vae"),\n'
        '    scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(folder, subfolder="scheduler"),\n'
        f"){cast}\n"
        '(embeds, mask), (empty, empty_mask) = encode("a red circle"), encode("")\n'
        + _call(generation, embeds.rstrip(", ") + ",\n             negative_prompt_attention_mask=empty_mask")
        + ").images[0]"
    )


def export(parts: ExportParts) -> PipelineExport:
    """A whole SanaPipeline folder with Sana's own Gemma-2 conditioner, else the pieces (see the module)."""
    conditioner = parts.text_encoder
    bundled = isinstance(conditioner, SanaConditioner)
    if not bundled and not isinstance(conditioner, FrozenTextEncoder):
        raise ConfigError(
            "text_encoder.kind",
            parts.cfg.text_encoder.kind,
            "a Sana export hands SanaPipeline the prompt embeddings of Sana's Gemma-2 (`sana`) or of one "
            "transformers text encoder (`auto`, `t5`, `clip`), and this conditioner is neither",
            "train Sana with `text_encoder=sana` (or one text encoder) to export it",
        )
    if not isinstance(parts.vae, AutoencoderDC):  # SanaPipeline reads its latent size from the DC's config
        raise ConfigError(
            "vae.kind",
            parts.cfg.vae.kind,
            "SanaPipeline decodes with an AutoencoderDC (it reads the downsampling factor from its "
            "`encoder_block_out_channels`), and this run's VAE is another",
            "train Sana with `vae=sana` (`vae.kind=autoencoder_dc`) to export it; the checkpoint's transformer/ "
            "folder is already a diffusers SanaTransformer2DModel",
        )
    te = parts.cfg.text_encoder
    generation = _generation(parts.cfg)
    manifest = {
        "text_encoder": {
            **named_text_encoder(te, conditioner.model, bundled),
            "instruction": list(te.instruction),
            "conditioning": "SanaPipeline.encode_prompt's prompt_embeds and prompt_attention_mask (the instruction "
            "before the prompt, max_length tokens kept)"
            if bundled
            else "last_hidden_state and attention_mask of the prompt tokenized with padding='max_length', "
            "truncation=True, max_length=max_length, passed as prompt_embeds/prompt_attention_mask",
            "unconditional": "the empty prompt '' (no instruction): the negative prompt of classifier-free guidance",
        },
        "generation": generation,
    }
    manifest["latents"] = (
        "an AutoencoderDC's latents are only scaled (no shift, no per-channel statistics): vae/ is the run's; "
        "decode with vae.decode(latents / vae.config.scaling_factor), as SanaPipeline does"
    )

    def save(folder: Path) -> None:
        if bundled:
            save_with_encoder(parts, SanaPipeline, conditioner.tokenizer, conditioner.model, folder)
        else:
            save_pieces(parts, folder)

    def usage(folder: str) -> str:
        return (_bundled_usage if bundled else _pieces_usage)(folder, parts, generation)

    return PipelineExport(bundled, manifest, save, usage)


SANA = Family(
    transformer_class=SanaTransformer2DModel,
    build=build,
    mismatch=mismatch,
    predict=predict,
    pipeline="SanaPipeline",
    export=export,
    check=check,
    input_layer="patch_embed.proj",
    lora_targets=LORA_TARGETS,
)
