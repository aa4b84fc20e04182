"""Sana: ``SanaTransformer2DModel`` (linear self-attention, cross-attention to text, a GLUMBConv feed-forward) on the
32x deep-compression autoencoder's latents (``vae.kind=autoencoder_dc``), trained with flow matching.

A new transformer's cross-attention works at the inner size (``heads x head_dim``): its caption projection maps the
conditioner's features (``caption_channels``) there. Its cross-attention heads default to the self-attention's
(``model.extra_config`` may set ``num_cross_attention_heads``/``cross_attention_head_dim``, ``mlp_ratio``,
``qk_norm``, ``interpolation_scale``, ...). Sana has no positional embedding by default, so non-square latents
(buckets) need nothing.

The timestep is passed as ``SanaPipeline`` passes it: the scheduler's ``sigma x 1000`` times the transformer's
``timestep_scale``. An export is a whole ``SanaPipeline`` folder with the run's text encoder in it: Sana's own
Gemma-2 (``conditioner.kind=sana``) or another transformers text encoder (the shapes default's MiniLM), which
``encode_prompt`` calls as it calls Gemma-2 when no instruction is put before the prompt
(``complex_human_instruction=None``: the manifest's ``required`` says so, with the pipeline's other hard-coded
defaults that do not fit the run: height and width 1024, resolution binning at Sana's own sizes). ``SanaPipeline``
decodes ``latents / vae.config.scaling_factor`` and an
``AutoencoderDC``'s latents are only scaled by ``FrozenVAE`` (no shift, no per-channel statistics), so the exported
VAE is the run's as it is. (SanaPipeline takes no other autoencoder, so a run on another VAE trains but does not
export.)
"""

from __future__ import annotations

import inspect
from pathlib import Path

import torch
from diffusers import AutoencoderDC, SanaPipeline, SanaTransformer2DModel

from dit_trainer.components.conditioners.sana import SanaConditioner
from dit_trainer.components.conditioners.text_encoder import FrozenTextEncoder
from dit_trainer.components.families.base import (
    ExportParts,
    Family,
    PipelineExport,
    architecture,
    cross_attention_prediction,
    features_mismatch,
    input_mismatch,
    named_text_encoder,
    require_extra_at_least,
    require_extra_one_of,
    require_flow_matching,
    require_further_arguments,
    require_inner_cross_attention,
    save_with_encoder,
)
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, DataConfig, DiffusionConfig, ModelConfig, PrivacyConfig
from dit_trainer.errors import ConfigError, require

# The sample sizes SanaPipeline's resolution binning knows (its aspect-ratio tables); others: "Invalid sample size".
BINNED_SAMPLE_SIZES = (16, 32, 64, 128)
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


def check(model: ModelConfig, privacy: PrivacyConfig, diffusion: DiffusionConfig) -> None:
    """Flow matching, a cross-attention at the inner size, ``extra_config`` keys the class takes, no guidance
    embedding (that is Sana-Sprint, whose pipeline is another), no DP-SGD (its modulation tables are used inline)."""
    m = model
    require_flow_matching(
        diffusion,
        "Sana is trained with flow matching (its released weights predict the flow velocity)",
        "use `diffusion=flow` (objective flow_matching, FlowMatchEulerDiscreteScheduler)",
    )
    require(
        not privacy.enabled,
        "privacy.enabled",
        privacy.enabled,
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


def _generation(conditioner: ConditionerConfig, data: DataConfig, diffusion: DiffusionConfig) -> dict:
    """SanaPipeline's arguments that reproduce our sampler (with the prompt, and ``latents=`` for the same noise)."""
    te, d = conditioner, diffusion
    return {
        "height": data.resolution,
        "width": data.resolution,
        "num_inference_steps": d.sample_steps,
        "guidance_scale": d.guidance_scale,
        "negative_prompt": "",
        "max_sequence_length": te.max_length,
        "complex_human_instruction": list(te.instruction) or None,
        "use_resolution_binning": False,
        "clean_caption": False,
    }


def _required(parts: ExportParts, instruction: list[str] | None) -> dict:
    """What ``pipe(prompt)`` needs beyond SanaPipeline's defaults to generate at the trained size, each hard-coded
    in the pipeline: its height and width (1024), its resolution binning (Sana's own sample sizes only, else "Invalid
    sample size"), and its complex human instruction (put before every prompt: with another text encoder, or
    another instruction, the prompt would not be encoded as in training)."""
    resolution, sample_size = parts.data.resolution, parts.transformer.config.sample_size
    defaults = inspect.signature(SanaPipeline.__call__).parameters
    factor = 2 ** (len(parts.vae.config.encoder_block_out_channels) - 1)  # SanaPipeline's vae_scale_factor
    required = {}
    if sample_size not in BINNED_SAMPLE_SIZES or sample_size * factor != resolution:
        required["use_resolution_binning"] = False
    if defaults["height"].default != resolution or defaults["width"].default != resolution:
        required |= {"height": resolution, "width": resolution}
    if instruction != defaults["complex_human_instruction"].default:
        required["complex_human_instruction"] = instruction
    return required


def _usage(folder: str, parts: ExportParts, generation: dict, required: dict) -> str:
    """Python that loads the export in ``folder`` and generates an image as our sampler would."""
    cast = parts.dtype != "float32"
    imports, torch_dtype = ("import torch\n", f", torch_dtype=torch.{parts.dtype}") if cast else ("", "")
    keys = ("num_inference_steps", "guidance_scale", "max_sequence_length", *required)
    instruction = generation["complex_human_instruction"]
    settings = ", ".join(
        f"{key}=instruction" if key == "complex_human_instruction" and instruction else f"{key}={generation[key]!r}"
        for key in dict.fromkeys(keys)
    )
    return (
        f"{imports}from diffusers import SanaPipeline\n\n"
        f"pipe = SanaPipeline.from_pretrained({folder!r}{torch_dtype})  # or DiffusionPipeline.from_pretrained\n"
        + (f"instruction = {instruction!r}\n" if instruction and "complex_human_instruction" in required else "")
        + f'image = pipe("a red circle", {settings}).images[0]'
    )


def export(parts: ExportParts) -> PipelineExport:
    """A whole SanaPipeline folder with the run's text encoder: Sana's own Gemma-2 conditioner, or one transformers
    text encoder (MiniLM, T5, ...), which SanaPipeline's ``encode_prompt`` calls as it calls Gemma-2 when no
    instruction is put before the prompt."""
    conditioner = parts.text_encoder
    bundled_own = isinstance(conditioner, SanaConditioner)
    if not bundled_own and not isinstance(conditioner, FrozenTextEncoder):
        raise ConfigError(
            "conditioner.kind",
            parts.conditioner.kind,
            "a Sana export hands SanaPipeline Sana's Gemma-2 (`sana`) or one transformers text encoder (`auto`, "
            "`t5`, `clip`), and this conditioner is neither",
            "train Sana with `conditioner=sana` (or one text encoder) to export it",
        )
    if not isinstance(parts.vae, AutoencoderDC):  # SanaPipeline reads its latent size from the DC's config
        raise ConfigError(
            "vae.kind",
            parts.vae_kind,
            "SanaPipeline decodes with an AutoencoderDC (it reads the downsampling factor from its "
            "`encoder_block_out_channels`), and this run's VAE is another",
            "train Sana with `vae=sana` (`vae.kind=autoencoder_dc`) to export it; the checkpoint's transformer/ "
            "folder is already a diffusers SanaTransformer2DModel",
        )
    te = parts.conditioner
    generation = _generation(parts.conditioner, parts.data, parts.diffusion)
    required = _required(parts, generation["complex_human_instruction"])
    generation |= required
    manifest = {
        "text_encoder": {
            **named_text_encoder(te, conditioner.model),
            "instruction": list(te.instruction),
            "conditioning": "SanaPipeline.encode_prompt's prompt_embeds and prompt_attention_mask (the instruction "
            "before the prompt, max_length tokens kept)",
            "unconditional": "the empty prompt '' (no instruction): the negative prompt of classifier-free guidance",
        },
        "generation": generation,
        "required": required,  # what pipe(prompt) needs beyond its defaults to generate at the trained size
        "latents": "an AutoencoderDC's latents are only scaled (no shift, no per-channel statistics): vae/ is the "
        "run's; decode with vae.decode(latents / vae.config.scaling_factor), as SanaPipeline does",
    }

    def save(folder: Path) -> None:
        save_with_encoder(parts, SanaPipeline, conditioner.tokenizer, conditioner.model, folder)

    return PipelineExport(True, manifest, save, lambda folder: _usage(folder, parts, generation, required))


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
