"""Z-Image: ``ZImageTransformer2DModel``, a single-stream DiT (Z-Image-Turbo: 6.15 B parameters). Caption tokens pass
a few unmodulated refiner blocks, image tokens a few modulated ones, and then both run through one stack of
modulated blocks as a single sequence, with 3-axis rotary positions (caption index, row, column).

``predict`` does what ZImagePipeline does around the transformer, which differs from every other family here:
- the transformer takes **lists**: one ``(C, 1, H, W)`` latent per image, and one caption of its real tokens only
  (``(L_i, D)``; the conditioner's padding is dropped, since the transformer pads each caption to a multiple of 32
  tokens with a learned token that every other token attends to);
- its time runs the other way: it is given ``1 - sigma`` (0 is noise, 1 the image), where the scheduler's
  timestep is ``sigma x 1000``;
- it predicts the **negated** velocity, ``x0 - noise``: the pipeline steps along ``-output``, and so does ``predict``.

A new model is sized by ``model.*`` and the conditioner: ``dim`` = heads x head_dim, ``n_layers`` =
``model.num_layers``, ``cap_feat_dim`` the conditioner's hidden size, ``in_channels`` the VAE's latent channels; the
transformer cuts 2 x 2 latent patches itself (``model.patch_size`` must say 2). ``model.extra_config`` may give
``n_refiner_layers`` (default 2), ``axes_dims`` (default: Z-Image's 32:48:48 proportions of the head), ``axes_lens``,
``rope_theta``, ``qk_norm``, ``norm_eps`` and ``t_scale``.

The export is a ``ZImagePipeline``: with Z-Image's own Qwen3 (``conditioner.kind=z_image``) a whole folder that takes
prompts as text; with a transformers text encoder (the shapes recipes' MiniLM) the pipeline without its text encoder,
and the run's in ``conditioner/``, whose usage passes the embeddings as ``prompt_embeds``. Our CFG,
``uncond + s (cond - uncond)``, is the pipeline's ``cond + g (cond - uncond)`` with ``g = s - 1``; at a fixed shift
the generation settings hand it our sampler's noise levels (``sigmas``), which it would space otherwise. Its VAE is
FLUX.1's kind (an ``AutoencoderKL`` with a ``shift_factor``), which the pipeline un-normalises itself. DP-SGD is
refused (``check`` says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from diffusers import ZImagePipeline, ZImageTransformer2DModel

from dit_trainer.components.conditioners.text_encoder import FrozenTextEncoder
from dit_trainer.components.conditioners.z_image import ZImageConditioner
from dit_trainer.components.families.base import (
    CONDITIONER_FOLDER,
    ExportParts,
    Family,
    PipelineExport,
    bundled_usage,
    features_mismatch,
    input_mismatch,
    require_extra_at_least,
    require_flow_matching,
    require_further_arguments,
    require_guidance_of_at_least_one,
    require_rope_axes,
    sampler_generation,
    save_text_encoder,
    save_with_encoder,
)
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, DiffusionConfig, ModelConfig, PrivacyConfig
from dit_trainer.errors import ConfigError, require

PATCH = 2  # the transformer's own patching (ZImagePipeline's patch_size): 2 x 2 latents a token
PIPELINE_SIZE = 1024  # ZImagePipeline's default height and width
CONDITIONERS = ("z_image", "auto", "t5", "clip")  # its own Qwen3, or one transformers text encoder
# The attention projections and the SwiGLU feed-forward of every block (diffusers' Z-Image LoRA loader's names).
LORA_TARGETS = (
    "attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0",
    "feed_forward.w1", "feed_forward.w2", "feed_forward.w3",
)  # fmt: skip
# Constructor arguments the family sets from `model.*`, the VAE and the conditioner: not for `model.extra_config`.
SET_HERE = frozenset(
    {"all_patch_size", "all_f_patch_size", "in_channels", "dim", "n_layers", "n_heads", "n_kv_heads", "cap_feat_dim",
     "siglip_feat_dim"}
)  # fmt: skip


def rope_axes(head_dim: int) -> tuple[int, int, int]:
    """The rotary dimensions of (caption index, row, column): Z-Image's (32, 48, 48) of 128 in proportion, each even
    and summing to ``head_dim``."""
    side = 2 * ((3 * head_dim) // 16)
    return head_dim - 2 * side, side, side


def patch_size_of(config: Mapping) -> int | None:
    """Latents per token side of a Z-Image config: ``PATCH`` when its ``all_patch_size`` offers it (what
    ``predict`` and the pipeline use), else None (its mismatch says why)."""
    return PATCH if PATCH in list(config.get("all_patch_size") or ()) else None


def _check_new(m: ModelConfig) -> None:
    """What a new Z-Image transformer needs of ``model.*``."""
    require_further_arguments(m, ZImageTransformer2DModel, SET_HERE)
    require_extra_at_least(m, "n_refiner_layers", 1, "the number of caption and image refiner blocks")
    require(
        m.patch_size == PATCH,
        "model.patch_size",
        m.patch_size,
        "Z-Image cuts 2 x 2 latent patches (the pipeline's patch_size; the resolution and bucket checks read it here)",
        f"set `model.patch_size={PATCH}`",
    )
    unused = {
        "learned_sigma": "Z-Image predicts the velocity alone, no variance",
        "cross_attention_dim": "Z-Image attends to the caption within one joint sequence, with no cross-attention",
        "dropout": "Z-Image's blocks have no dropout",
    }
    for key, why in unused.items():
        require(not getattr(m, key), f"model.{key}", getattr(m, key), why, f"remove `model.{key}` (its default)")
    require_rope_axes(m, "axes_dims", "caption index, row, column", rope_axes)


def check(
    model: ModelConfig, privacy: PrivacyConfig, conditioner: ConditionerConfig, diffusion: DiffusionConfig
) -> None:
    """Flow matching, no pooled vector (Z-Image takes none), no DP-SGD, and a new model's sizes."""
    require_flow_matching(
        diffusion,
        "Z-Image is trained with flow matching (its released weights predict the flow velocity, negated)",
        "set `diffusion=flow` (Z-Image-Turbo samples at a fixed `diffusion.shift=3.0`)",
    )
    require(
        conditioner.kind in CONDITIONERS,
        "conditioner.kind",
        conditioner.kind,
        "Z-Image is conditioned on one encoder's hidden states (no pooled vector): its own Qwen3 or one "
        "transformers text encoder, the two an export can hand ZImagePipeline",
        "use `conditioner=z_image`, or a transformers text encoder (`conditioner=minilm`, `conditioner=t5`)",
    )
    require(
        conditioner.pooling == "none",
        "conditioner.pooling",
        conditioner.pooling,
        "Z-Image takes the caption's hidden states alone (no pooled vector), so it would be ignored",
        "set `conditioner.pooling=none`",
    )
    require(
        not privacy.enabled,
        "privacy.enabled",
        privacy.enabled,
        "DP-SGD does not support ZImageTransformer2DModel: its embedders run on the tokens of the whole batch at once "
        "(per-sample gradients would be per token), and its pad tokens and RMSNorm weights are outside Opacus' layers",
        "set `privacy.enabled=false`, or use a PixArt family for private training",
    )
    if model.pretrained is None:
        _check_new(model)


def build(cfg: ModelConfig, in_channels: int, sample_size: int, condition: ConditionSize) -> ZImageTransformer2DModel:
    """A new transformer sized by ``model.*`` (see the module); ``sample_size`` is not the class's: it takes any."""
    extra = dict(cfg.extra_config)
    extra["axes_dims"] = list(extra.get("axes_dims") or rope_axes(cfg.attention_head_dim))
    return ZImageTransformer2DModel(
        all_patch_size=(PATCH,),
        all_f_patch_size=(1,),
        in_channels=in_channels,
        dim=cfg.num_attention_heads * cfg.attention_head_dim,
        n_layers=cfg.num_layers,
        n_heads=cfg.num_attention_heads,
        n_kv_heads=cfg.num_attention_heads,  # (the class ignores it: its attention has no grouped keys)
        cap_feat_dim=condition.sequence,
        **extra,
    )


def mismatch(config: dict, in_channels: int, condition: ConditionSize) -> str | None:
    if config.get("siglip_feat_dim"):
        return "it is a Z-Image Omni transformer (it takes SigLIP image features), whose pipeline is another"
    if patch_size_of(config) is None:
        return f"it offers the patch sizes {config.get('all_patch_size')}, and ZImagePipeline uses {PATCH}"
    return features_mismatch(config, "cap_feat_dim", condition.sequence) or input_mismatch(config, in_channels)


def predict(
    transformer: ZImageTransformer2DModel, x_t: torch.Tensor, t: torch.Tensor, condition: Condition
) -> torch.Tensor:
    """ZImagePipeline's call: per-image lists, each caption's real tokens, ``1 - sigma``, and the output negated. On
    the meta device (the FLOP and memory counts, which cannot see a mask's values) every token counts: the most a
    caption of ``conditioner.max_length`` tokens costs."""
    images = list(x_t.unsqueeze(2).unbind(0))
    rows, masks = condition.sequence, condition.mask
    captions = list(rows.unbind(0)) if rows.is_meta else [row[mask.bool()] for row, mask in zip(rows, masks)]
    time = (1000 - t.expand(x_t.shape[0])) / 1000
    return -torch.stack(transformer(images, time, captions, return_dict=False)[0]).squeeze(2)


def _generation(parts: ExportParts, bundled: bool) -> dict:
    """ZImagePipeline's arguments that reproduce our sampler (with the prompt, and ``latents=`` for the same noise)."""
    # the pipeline's g: cond + g (cond - uncond)
    generation = sampler_generation(parts, guidance_scale=parts.diffusion.guidance_scale - 1, cfg_normalization=False)
    if bundled:
        generation |= {"negative_prompt": "", "max_sequence_length": parts.conditioner.max_length}
    return generation


def _pieces_usage(folder: str, parts: ExportParts, generation: dict) -> str:
    """Python that loads the export in ``folder`` (the pipeline without its text encoder, the run's in
    ``conditioner/``) and generates an image as our sampler would, passing our conditioner's embeddings."""
    settings = ", ".join(f"{key}={value!r}" for key, value in generation.items())
    cast = parts.dtype != "float32"
    torch_dtype = f", torch_dtype=torch.{parts.dtype}" if cast else ""
    te = parts.conditioner
    encoder_class = type(parts.text_encoder.model).__name__
    to_dtype = f".to(torch.{parts.dtype})" if cast else ""
    return (
        "import torch\nfrom diffusers import ZImagePipeline\n"
        f"from transformers import AutoTokenizer, {encoder_class}\n\n"
        f"folder = {folder!r}\n"
        f'tokenizer = AutoTokenizer.from_pretrained(folder, subfolder="{CONDITIONER_FOLDER}/tokenizer")\n'
        f'encoder = {encoder_class}.from_pretrained(folder, subfolder="{CONDITIONER_FOLDER}/text_encoder").eval()\n'
        "\n\n"
        "@torch.no_grad()\ndef embed(prompts):  # each prompt's real tokens, as ZImagePipeline's prompt_embeds list\n"
        f'    tokens = tokenizer(prompts, padding="max_length", max_length={te.max_length}, truncation=True, '
        'return_tensors="pt")\n'
        "    hidden = encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state\n"
        f"    return [row[mask.bool()]{to_dtype} for row, mask in zip(hidden, tokens.attention_mask)]\n\n\n"
        "# The pipeline's own text encoder is not in the folder: it takes this run's embeddings\n"
        f"pipe = ZImagePipeline.from_pretrained(folder, text_encoder=None, tokenizer=None{torch_dtype})\n"
        'image = pipe(prompt_embeds=embed(["a red circle"]), negative_prompt_embeds=embed([""]),\n'
        f"             {settings}).images[0]"
    )


def _conditioning(parts: ExportParts, bundled: bool) -> dict:
    if bundled:
        return {
            "bundled": True,
            "conditioning": "ZImagePipeline.encode_prompt: Qwen3's penultimate hidden states of the chat-templated "
            "prompt (max_sequence_length tokens), its real tokens only; the empty prompt '' is the negative prompt of "
            "classifier-free guidance",
        }
    te = parts.conditioner
    return {
        "bundled": False,
        "pretrained": f"{CONDITIONER_FOLDER}/text_encoder",
        "tokenizer": f"{CONDITIONER_FOLDER}/tokenizer",
        "class": type(parts.text_encoder.model).__name__,
        "max_length": te.max_length,
        "conditioning": "prompt_embeds: a list of each prompt's last hidden states at its real tokens (tokenized with "
        "padding='max_length', truncation=True, max_length=max_length); the empty prompt '' gives the negative ones",
    }


def export(parts: ExportParts) -> PipelineExport:
    """A ZImagePipeline folder: whole with Z-Image's own Qwen3, else without text encoder and the run's transformers
    text encoder in ``conditioner/`` (see the module)."""
    conditioner = parts.text_encoder
    require_guidance_of_at_least_one(parts.diffusion, "ZImagePipeline")
    bundled = isinstance(conditioner, ZImageConditioner)
    if not bundled and not isinstance(conditioner, FrozenTextEncoder):
        raise ConfigError(
            "conditioner.kind",
            parts.conditioner.kind,
            "a Z-Image export hands ZImagePipeline Z-Image's own Qwen3 (`z_image`) or the embeddings of one "
            "transformers text encoder (`auto`, `t5`, `clip`), and this conditioner is neither",
            "train Z-Image with `conditioner=z_image` (or one text encoder) to export it",
        )
    if parts.vae.config.shift_factor is None:  # folded into the weights; the pipeline adds it unconditionally
        parts.vae.register_to_config(shift_factor=0.0)
    generation = _generation(parts, bundled)
    required = (
        {}
        if parts.data.resolution == PIPELINE_SIZE
        else {"height": parts.data.resolution, "width": parts.data.resolution}
    )
    manifest = {"text_encoder": _conditioning(parts, bundled), "generation": generation, "required": required}

    def save(folder: Path) -> None:
        if bundled:
            save_with_encoder(parts, ZImagePipeline, conditioner.tokenizer, conditioner.model, folder)
            return
        pipeline = ZImagePipeline(
            transformer=parts.transformer, vae=parts.vae, scheduler=parts.scheduler, text_encoder=None, tokenizer=None
        )
        pipeline.save_pretrained(folder)
        save_text_encoder(parts, folder / CONDITIONER_FOLDER)

    usage = bundled_usage if bundled else _pieces_usage
    return PipelineExport(bundled, manifest, save, lambda folder: usage(folder, parts, generation))


Z_IMAGE = Family(
    transformer_class=ZImageTransformer2DModel,
    build=build,
    mismatch=mismatch,
    predict=predict,
    pipeline="ZImagePipeline",
    export=export,
    check=check,
    input_layer=f"all_x_embedder.{PATCH}-1",
    lora_targets=LORA_TARGETS,
    blocks=("noise_refiner", "context_refiner", "layers"),
    pipeline_applies_shift=True,
    resolution_shift=True,
    patch_size_of=patch_size_of,
)
