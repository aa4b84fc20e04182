"""What the MMDiT families (SD3, Flux) share: text tokens joining the image tokens' attention, a pooled text vector
in the timestep modulation (``pooled_projections``), and rectified flow. Each family passes its own name, pipeline
and conditioner kind, so the messages still name them."""

from __future__ import annotations

from dataclasses import dataclass

from diffusers import ModelMixin

from dit_trainer.components.families.base import (
    features_mismatch,
    input_mismatch,
    require_flow_matching,
    require_further_arguments,
)
from dit_trainer.condition import ConditionSize
from dit_trainer.config import ConditionerConfig, DiffusionConfig, ModelConfig
from dit_trainer.errors import ConfigError, require

POOLED_KINDS = ("sd3", "flux")  # conditioner kinds that always give a pooled vector
# Attention of both streams (the image's to_*, the text's add_*_proj / to_add_out) and both feed-forwards: an MMDiT
# block's LoRA targets, in SD3's and Flux's alike.
LORA_TARGETS = (
    "to_q",
    "to_k",
    "to_v",
    "to_out.0",
    "add_q_proj",
    "add_k_proj",
    "add_v_proj",
    "to_add_out",
    "ff.net.0.proj",
    "ff.net.2",
    "ff_context.net.0.proj",
    "ff_context.net.2",
)


@dataclass(frozen=True)
class MMDiT:
    """One MMDiT family: its ``name`` in messages, ``pipeline`` (the export's class name), ``kind`` (its own
    conditioner, ``conditioner.kind``), ``encoders`` (what that conditioner is, in words), ``pooled_by`` (where the
    pooled vector enters the transformer), ``transformer_class`` and ``derived``, its constructor arguments the
    family sets from ``model.*``, the VAE and the conditioner (the others are ``model.extra_config``'s).

    For the export (``mmdit_export``): ``text_parts``, the pipeline's text components and the attributes of the
    family's conditioner that hold them; ``own_conditioning``, how the pipeline encodes a prompt (the manifest's
    words); ``cfg_scale``, the pipeline argument that is our classifier-free guidance scale."""

    name: str
    pipeline: str
    kind: str
    encoders: str
    pooled_by: str
    transformer_class: type[ModelMixin]
    derived: frozenset[str]
    text_parts: dict[str, str]
    own_conditioning: str
    cfg_scale: str = "guidance_scale"


def check(
    family: MMDiT, conditioner: ConditionerConfig, diffusion: DiffusionConfig, flow_fix: str = "set `diffusion=flow`"
) -> None:
    """A pooled text vector (the family's own encoders give one, another text encoder with ``pooling``) and
    rectified flow: the family's weights predict the flow's velocity and its pipeline samples with flow matching."""
    te = conditioner
    require(
        te.kind in POOLED_KINDS or te.pooling != "none",
        "conditioner.pooling",
        te.pooling,
        f"{family.name}'s {family.pooled_by} adds a pooled text vector (`pooled_projections`), and "
        f"`conditioner.kind={te.kind}` with `pooling=none` gives none",
        f"set `conditioner={family.kind}` ({family.encoders}, {family.name}'s own) or `conditioner.pooling=mean` "
        "(e.g. MiniLM's sentence embedding) or `pooling=pooler`",
    )
    require_flow_matching(
        diffusion,
        f"{family.name} is a rectified-flow model: its weights predict the flow's velocity, and {family.pipeline} "
        "(the export) samples with FlowMatchEulerDiscreteScheduler only",
        flow_fix,
    )


def check_new(family: MMDiT, m: ModelConfig) -> None:
    """A new MMDiT predicts the velocity only (no learned variance half), has no dropout, and takes in
    ``model.extra_config`` only the constructor arguments ``model.*`` does not decide."""
    require_further_arguments(m, family.transformer_class, family.derived)
    require(
        not m.learned_sigma,
        "model.learned_sigma",
        m.learned_sigma,
        "flow matching predicts a velocity, with no variance half to learn",
        "set `model.learned_sigma=false`",
    )
    require(
        m.dropout == 0.0,
        "model.dropout",
        m.dropout,
        f"{family.transformer_class.__name__} has no dropout",
        "set `model.dropout=0`",
    )


def pooled_width(family: MMDiT, condition: ConditionSize) -> int:
    """The pooled width a new transformer's ``pooled_projection_dim`` takes; a conditioner without one is refused
    (``check`` refuses the config before, this is for a conditioner built in Python)."""
    if condition.pooled is None:
        raise ConfigError(
            "conditioner.pooling",
            "none",
            f"{family.name} needs a pooled text vector and this text encoder gives none",
            f"set `conditioner.pooling=mean` or use `conditioner={family.kind}`",
        )
    return condition.pooled


def mismatch(config: dict, in_channels: int, condition: ConditionSize) -> str | None:
    """Why a loaded MMDiT does not fit the conditioner's hidden size and pooled width or the (packed) latents'
    channels ``in_channels`` (None when it does)."""
    if found := features_mismatch(config, "joint_attention_dim", condition.sequence):
        return found
    if config["pooled_projection_dim"] != condition.pooled:
        return (
            f"it expects a {config['pooled_projection_dim']}-dim pooled text vector while the text encoder gives "
            + ("none" if condition.pooled is None else f"{condition.pooled}")
        )
    return input_mismatch(config, in_channels)
