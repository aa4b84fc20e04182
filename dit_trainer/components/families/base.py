"""The interface every transformer family implements (see ``dit_trainer.components.families``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, ModelMixin
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from torch import nn

from dit_trainer.components.families.arguments import (
    constructor_parameters,
    describe,
    expected_type,
    fits,
    override_text,
    plain,
)
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, DataConfig, DiffusionConfig, ModelConfig
from dit_trainer.errors import require

# Where an export keeps the run's text encoder when the family's pipeline cannot take it (``save_text_encoder``).
CONDITIONER_FOLDER = "conditioner"
# The attention projections and feed-forward layers of diffusers' transformer blocks: the usual LoRA targets.
ATTENTION_AND_FEED_FORWARD = ("to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2")
# The activations diffusers' FeedForward builds (PixArt's and DiT's `activation_fn`): it fails on others.
FEED_FORWARD_ACTIVATIONS = ("gelu", "gelu-approximate", "geglu", "geglu-approximate", "swiglu", "linear-silu")


@dataclass(frozen=True)
class ExportParts:
    """What an export assembles a family's pipeline from: the run's sections that decide how it samples, its models
    ready to save (``vae`` with the latent normalisation folded in), ``pipeline`` (the family's pipeline class name),
    the dtype's name and the trained latent shape (C, H, W) at ``data.resolution``."""

    model: ModelConfig
    vae_kind: str  # `vae.kind`
    conditioner: ConditionerConfig
    data: DataConfig
    diffusion: DiffusionConfig
    transformer: ModelMixin
    vae: ModelMixin
    scheduler: SchedulerMixin
    text_encoder: nn.Module
    pipeline: str
    dtype: str
    latent_shape: tuple[int, ...]


@dataclass(frozen=True)
class PipelineExport:
    """A family's export: ``bundled`` (the folder's pipeline holds its text encoders and takes prompts as text;
    otherwise it takes the run's embeddings), the manifest entries it adds (conditioning, generation settings, the
    arguments the pipeline's defaults lack), ``save(folder)``, and ``usage(folder)``: Python that loads the folder and
    generates an image as our sampler would."""

    bundled: bool
    manifest: dict
    save: Callable[[Path], None]
    usage: Callable[[str], str]


def config_patch_size(config: Mapping) -> int | None:
    """A diffusers transformer config's ``patch_size``: latents per token side before any packing (None: the config
    does not say, as another family's does not; its mismatch is named when it loads)."""
    return config.get("patch_size")


def classifier_free_guidance(cond: torch.Tensor, uncond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
    """``uncond + s (cond - uncond)``: how every pipeline but Qwen-Image's combines CFG's two predictions."""
    return uncond + guidance_scale * (cond - uncond)


@dataclass(frozen=True)
class Family:
    """One transformer family.

    ``build(cfg, in_channels, sample_size, condition_size)``: a new transformer whose input follows the VAE
    (latent channels, latent size) and whose conditioning inputs follow the conditioner's ``ConditionSize`` (hidden
    size and pooled width, or for class conditioning the number of classes).
    ``mismatch(config, in_channels, condition_size)``: why a loaded transformer's config does not fit the run
    (None when it does). ``predict(transformer, x_t, t, condition)``: the prediction for ``x_t`` at timesteps ``t``,
    ``x_t``'s channels only (a learned-variance half, packing and positional ids are the family's to handle).
    ``pipeline``: the diffusers pipeline class an export writes, ``export``: how.
    ``check``: the family's own config rules, run before any model is built, on the config sections its
    parameters name (``config.call_with_sections``).
    """

    transformer_class: type[ModelMixin]
    build: Callable[[ModelConfig, int, int, ConditionSize], ModelMixin]
    mismatch: Callable[[dict, int, ConditionSize], str | None]
    predict: Callable[[ModelMixin, torch.Tensor, torch.Tensor, Condition], torch.Tensor]
    pipeline: str
    export: Callable[[ExportParts], PipelineExport]
    check: Callable[..., None] | None = None
    prepare: Callable[[ModelMixin], None] | None = None  # applied to every built or loaded transformer
    # Applied after ``prepare`` with the run's ``model`` section: settings ``predict`` reads that are no weights
    # (Flux: the embedded guidance of a guidance-distilled model, ``model.embedded_guidance``).
    configure: Callable[[ModelMixin, ModelConfig], None] | None = None
    # Applied before DP-SGD's per-sample gradient engine (Opacus) sees the transformer, so that every parameter it
    # trains sits in a module that engine supports; before the optimizer and EMA collect the parameters.
    prepare_private: Callable[[ModelMixin], object] | None = None
    condition: str = "text"  # text: a text conditioner's Condition | class: class ids (conditioner.kind=class_labels)
    input_layer: str = "pos_embed.proj"  # the first layer the inputs meet: its dtype is the compute dtype
    lora_targets: tuple[str, ...] = ATTENTION_AND_FEED_FORWARD  # `lora.target_modules` when it is empty
    # The transformer's ModuleLists of repeated blocks: what `trainer.compile` compiles (one graph that every block
    # reuses), FSDP2's wrap units, and the units the memory estimate takes gradient checkpointing to recompute.
    blocks: tuple[str, ...] = ("transformer_blocks",)
    # Submodules (paths in the transformer) that run outside the block holding them: the DiT's timestep-and-label
    # embedder, block 0's, which every block and the output layer call. FSDP2 makes each a unit of its own, sharded
    # before the blocks: inside a block's unit its weights would stay sharded for every other caller.
    shared: tuple[str, ...] = ()
    # Latents per token side that ``predict`` packs before the transformer's own patches (Flux: 2 x 2, with
    # patch_size 1 in its config): what a pretrained model's latent sides must be a multiple of, beside patch_size.
    packing: int = 1
    # The pipeline decodes `latents / scaling_factor + shift_factor` (SD3's, Flux's): an export keeps a VAE's
    # shift_factor instead of folding it into quant convs (which SD3's and Flux's VAEs lack).
    pipeline_applies_shift: bool = False
    # How CFG combines the conditional and the empty-prompt predictions (``guide(cond, uncond, scale)``) in our
    # sampler, GRPO's rollouts and updates: as the family's pipeline does, so that an export samples what we do.
    guide: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = classifier_free_guidance
    # Submodules whose outputs never reach the prediction, given the transformer (Qwen-Image's last block's text
    # stream: no later block reads it): frozen, with any LoRA adapter in them, so that no trained parameter waits for
    # a gradient that cannot come (the gradient-flow check and DDP would stop on it).
    dead_ends: Callable[[ModelMixin], list[str]] | None = None
    # The pipeline un-normalises latents with the VAE's own statistics (QwenImagePipeline: its config's
    # `latents_mean`/`latents_std`; FLUX.2's: its BatchNorm's running ones): an export keeps the VAE as it is.
    pipeline_normalises: bool = False
    # Its pipeline samples with the resolution-dependent shift (`diffusion.resolution_shift`, FluxPipeline's grid
    # and mu): another family's pipeline would not reproduce our sampler with it, or refuse it.
    resolution_shift: bool = False
    # How that pipeline's mu follows the image (`diffusion.resolution_shift_rule`): linear in the tokens (Flux's,
    # Qwen-Image's) or FLUX.2's empirical one of the tokens and the step count.
    resolution_shift_rule: str = "linear"
    # Latents per token side in a transformer's config (its `patch_size`; Z-Image's lists one per patching mode).
    patch_size_of: Callable[[Mapping], int | None] = config_patch_size
    # The longest latent side a transformer's config has positions for (SD3's learned table); None: any (rotary).
    largest_latent_of: Callable[[Mapping], int] | None = None
    # It takes clips, latents (B, C, F, H, W) (an image is a clip of one frame): what `data.frames` > 1 needs.
    video: bool = False

    def latents_per_token(self, config: Mapping) -> int | None:
        """Latents per token side of a transformer with ``config``, the family's packing included: what a latent side
        must be a multiple of (None: the config does not say)."""
        patch = self.patch_size_of(config)
        return None if patch is None else patch * self.packing


def architecture(cfg: ModelConfig, in_channels: int, sample_size: int) -> dict:
    """The constructor arguments every DiT-style family shares: sizes from ``model.*``, input from the VAE, and
    twice the channels out with a learned variance."""
    return {
        "num_attention_heads": cfg.num_attention_heads,
        "attention_head_dim": cfg.attention_head_dim,
        "in_channels": in_channels,
        "out_channels": in_channels * (2 if cfg.learned_sigma else 1),
        "num_layers": cfg.num_layers,
        "dropout": cfg.dropout,
        "sample_size": sample_size,
        "patch_size": cfg.patch_size,
    }


def input_mismatch(config: dict, in_channels: int) -> str | None:
    """Why a loaded transformer does not take the VAE's latents (None when it does)."""
    if config["in_channels"] != in_channels:
        return f"it takes {config['in_channels']} input channels while the VAE gives {in_channels}"
    return None


def features_mismatch(config: dict, key: str, width: int) -> str | None:
    """Why a loaded transformer does not read the conditioner's ``width``-dim text features from the config entry
    ``key`` (``caption_channels``, ``joint_attention_dim``), None when it does."""
    if config[key] != width:
        return f"it expects {config[key]}-dim text features while the text encoder gives {width}"
    return None


def further_arguments(transformer_class: type[ModelMixin], derived: set[str] | frozenset[str]) -> tuple[str, ...]:
    """The constructor arguments of ``transformer_class`` that ``model.extra_config`` may give: all but those the
    family derives from ``model.*``, the VAE and the conditioner (``derived``)."""
    return tuple(sorted(set(inspect.signature(transformer_class.__init__).parameters) - set(derived) - {"self"}))


def require_further_arguments(m: ModelConfig, transformer_class: type[ModelMixin], derived: frozenset[str]) -> None:
    """``model.extra_config`` holds only constructor arguments of ``transformer_class`` that the family does not
    derive (``derived``), each a value of the argument's type (``arguments.expected_type``): one the family derives
    would silently lose to the family's value, an unknown one or a value of another type would fail deep in
    diffusers, after the models load. A family checks the ranges its class documents itself, after this."""
    allowed = further_arguments(transformer_class, derived)
    parameters = constructor_parameters(transformer_class)
    for key, value in m.extra_config.items():
        require(
            key in allowed,
            f"model.extra_config.{key}",
            value,
            f"{transformer_class.__name__}'s further arguments are {', '.join(allowed)}; "
            + ("this one follows `model.*` and the VAE/text encoder" if key in derived else "it has no such argument"),
            f"remove `{key}` from `model.extra_config`",
        )
        kind, default = expected_type(parameters[key]), parameters[key].default
        useful = default not in (None, ()) and fits(default, kind)  # (empty: not a default of the argument)
        example = f" ({transformer_class.__name__}'s default is `{override_text(default)}`)" if useful else ""
        require(
            fits(value, kind),
            f"model.extra_config.{key}",
            plain(value),
            f"{transformer_class.__name__}'s `{key}` takes {describe(kind)}",
            f"set `model.extra_config.{key}` to {describe(kind)}{example}, or remove it",
        )


def require_extra_at_least(m: ModelConfig, key: str, low: int, what: str) -> None:
    """``model.extra_config.<key>``, when given, is at least ``low`` (a count or a size: ``what`` says of what).
    Run after ``require_further_arguments``, which checks that it is a number."""
    value = m.extra_config.get(key)
    require(
        value is None or value >= low,
        f"model.extra_config.{key}",
        value,
        f"it is {what}, at least {low}",
        f"set `model.extra_config.{key}` to {low} or more, or remove it",
    )


def require_extra_one_of(m: ModelConfig, key: str, accepted: tuple, why: str) -> None:
    """``model.extra_config.<key>``, when given, is one of ``accepted``, the values the family's class builds with
    (``why`` names whose list that is). Run after ``require_further_arguments``."""
    if key not in m.extra_config:
        return
    listed = ", ".join(override_text(option) for option in accepted)
    require(
        m.extra_config[key] in accepted,
        f"model.extra_config.{key}",
        plain(m.extra_config[key]),
        f"{why} takes {listed}" if len(accepted) > 1 else f"{why} builds only with {listed}",
        f"set `model.extra_config.{key}` to one of those, or remove it"
        if len(accepted) > 1
        else f"remove `{key}` from `model.extra_config` ({listed} is its default)",
    )


def require_rope_axes(m: ModelConfig, key: str, axes: str, default: Callable[[int], tuple[int, ...]]) -> None:
    """A new transformer whose heads split into three even rotary parts (``axes`` names them): an even head of at
    least 8 for the family's ``default`` split, or ``model.extra_config.<key>``'s three even parts that sum to it."""
    head, given = m.attention_head_dim, m.extra_config.get(key)
    if given is None:
        require(
            head % 2 == 0 and head >= 8,
            "model.attention_head_dim",
            head,
            f"each head splits into three even rotary parts ({axes})",
            f"set an even `model.attention_head_dim` of at least 8, or `+model.extra_config.{key}=[...]`",
        )
        return
    require(
        len(given) == 3 and all(int(a) % 2 == 0 for a in given) and sum(given) == head,
        f"model.extra_config.{key}",
        given,
        f"three even rotary dimensions ({axes}) that sum to `model.attention_head_dim={head}`",
        f"set e.g. `+model.extra_config.{key}=[{', '.join(map(str, default(head)))}]`",
    )


def require_flow_matching(diffusion: DiffusionConfig, why: str, fix: str = "set `diffusion=flow`") -> None:
    """Families whose weights predict the flow's velocity (and whose pipelines sample with an Euler flow-matching
    scheduler) train with flow matching only; ``why`` names the family and its pipeline."""
    require(diffusion.objective == "flow_matching", "diffusion.objective", diffusion.objective, why, fix)


def require_inner_cross_attention(m: ModelConfig, why: str) -> None:
    """A new transformer that projects text features to its own width (heads x head_dim) has no cross-attention
    width of its own: ``model.cross_attention_dim`` may only repeat that width. ``why`` says where the family's text
    features go."""
    inner = m.num_attention_heads * m.attention_head_dim
    require(
        m.cross_attention_dim in (None, inner),
        "model.cross_attention_dim",
        m.cross_attention_dim,
        f"{why} at heads x head_dim = {inner} ({m.num_attention_heads} x {m.attention_head_dim})",
        f"set `model.cross_attention_dim={inner}` or `model.cross_attention_dim=null`",
    )


def named_text_encoder(te: ConditionerConfig, model: nn.Module) -> dict:
    """The manifest's text encoder of a single-encoder conditioner, bundled in the export folder (``text_encoder/``,
    ``tokenizer/``)."""
    return {
        "bundled": True,
        "pretrained": "text_encoder",
        "tokenizer_subfolder": "tokenizer",
        "class": type(model).__name__,
        "max_length": te.max_length,
    }


def rebuilt(model: ModelMixin, state: dict[str, torch.Tensor] | None = None, **changes) -> ModelMixin:
    """A copy of ``model`` built from its config with ``changes``, holding its weights (or ``state``), in eval mode.
    The config's private keys are dropped: ``from_config`` would restore the defaults its ``_use_default_values``
    lists over the changes."""
    config = {key: value for key, value in model.config.items() if not key.startswith("_")}
    copy = type(model).from_config({**config, **changes})
    copy.load_state_dict(model.state_dict() if state is None else state)
    return copy.eval()


def save_text_encoder(parts: ExportParts, folder: Path) -> None:
    """The run's single text encoder (``text_encoder/``, in the export's dtype) and its tokenizer (``tokenizer/``) in
    ``folder``: for an export whose pipeline cannot encode prompts with it, the usage computes the embeddings."""
    model = parts.text_encoder.model
    (model if parts.dtype == "float32" else model.to(getattr(torch, parts.dtype))).save_pretrained(
        folder / "text_encoder"
    )
    parts.text_encoder.tokenizer.save_pretrained(folder / "tokenizer")


def save_with_encoder(parts: ExportParts, pipeline_class: type, tokenizer, model: nn.Module, folder: Path) -> None:
    """A whole pipeline folder of a single-encoder pipeline (PixArt's, Sana's), the encoder in the export's dtype."""
    pipeline_class(
        tokenizer=tokenizer,
        text_encoder=model if parts.dtype == "float32" else model.to(getattr(torch, parts.dtype)),
        vae=parts.vae,
        transformer=parts.transformer,
        scheduler=parts.scheduler,
    ).save_pretrained(folder)


def cross_attention_prediction(
    transformer: ModelMixin, x_t: torch.Tensor, timestep: torch.Tensor, condition: Condition, **kwargs
) -> torch.Tensor:
    """The call of a transformer that cross-attends to the text (PixArt's, Sana's): the text tokens behind their
    mask, and of the output the channels of ``x_t`` only (a learned variance half is not predicted)."""
    return transformer(
        x_t,
        encoder_hidden_states=condition.sequence,
        encoder_attention_mask=condition.mask,
        timestep=timestep,
        return_dict=False,
        **kwargs,
    )[0][:, : x_t.shape[1]]


def fixed_shift_sigmas(scheduler: FlowMatchEulerDiscreteScheduler, steps: int) -> list[float] | None:
    """The noise levels our Euler sampler steps through at a fixed shift (diffusers' default spacing of the
    timesteps, then shifted), unshifted: ZImagePipeline and QwenImagePipeline space their own as
    ``linspace(1, 1/N, N)`` unless given ``sigmas``, and shift what they are given. None with the resolution shift,
    whose spacing is the pipelines'."""
    if scheduler.config.use_dynamic_shifting:
        return None
    ours = FlowMatchEulerDiscreteScheduler.from_config(scheduler.config)
    ours.set_timesteps(steps)
    shift = scheduler.config.shift
    return [float(sigma / (shift - (shift - 1) * sigma)) for sigma in ours.sigmas[:-1]]


def sampler_generation(parts: ExportParts, **guidance: object) -> dict:
    """The pipeline arguments that reproduce our sampler's size, steps and noise levels (with the prompt, and
    ``latents=`` for the same noise), ``guidance`` (the pipeline's names for our CFG) among them: at a fixed shift
    our sampler's levels (``sigmas``), which Z-Image's, Qwen-Image's and FLUX.2's pipelines would space otherwise."""
    generation = {
        "height": parts.data.resolution,
        "width": parts.data.resolution,
        "num_inference_steps": parts.diffusion.sample_steps,
        **guidance,
    }
    sigmas = fixed_shift_sigmas(parts.scheduler, parts.diffusion.sample_steps)
    if sigmas is not None:
        generation["sigmas"] = sigmas
    return generation


def bundled_usage(folder: str, parts: ExportParts, generation: dict, prompt_argument: str = "") -> str:
    """Python that loads a whole ``parts.pipeline`` folder (its own text encoder: prompts as text) from ``folder`` and
    generates an image as our sampler would; ``prompt_argument`` names the prompt where it is not the first
    argument (``prompt=``)."""
    settings = ", ".join(f"{key}={value!r}" for key, value in generation.items())
    cast = parts.dtype != "float32"
    torch_dtype = f", torch_dtype=torch.{parts.dtype}" if cast else ""
    return (
        ("import torch\n" if cast else "") + f"from diffusers import {parts.pipeline}\n\n"
        f"pipe = {parts.pipeline}.from_pretrained({folder!r}{torch_dtype})  # or DiffusionPipeline.from_pretrained\n"
        f'image = pipe({prompt_argument}"a red circle", {settings}).images[0]'
    )


def require_guidance_of_at_least_one(diffusion: DiffusionConfig, pipeline: str) -> None:
    """An export of a pipeline that guides only above our scale 1 (Z-Image's, Qwen-Image's, FLUX.2's) cannot sample as
    a run sampled with a scale below it."""
    require(
        diffusion.guidance_scale >= 1,
        "diffusion.guidance_scale",
        diffusion.guidance_scale,
        f"{pipeline} guides only with a scale above our 1: it cannot sample as this run did",
        "export a run sampled with `diffusion.guidance_scale` of 1 (no guidance) or more",
    )
