"""The checks of the model sections (``model``, ``lora``, ``vae``, ``conditioner``): each names a registry entry
(a family, a VAE kind, a conditioner kind) that checks its own part, the conditioner gives what the family is
conditioned on, the resolution cuts into whole patches, and every model named by hub id is on this machine when
the hub is offline."""

from __future__ import annotations

from dit_trainer.components import CONDITIONER_KINDS, VAE_KINDS
from dit_trainer.components.families import FAMILIES
from dit_trainer.components.fp8 import check_fp8
from dit_trainer.components.fused_qkv import check_fused_qkv
from dit_trainer.components.geometry import check_resolution
from dit_trainer.config import TrainConfig, call_with_sections
from dit_trainer.errors import ConfigError, require
from dit_trainer.hub import pretrained_config, require_offline_copy

CONDITIONS = {"text": "text", "class": "class labels"}


def check_components(cfg: TrainConfig) -> None:
    check_fp8(cfg.lora, cfg.privacy, cfg.precision)
    check_fused_qkv(cfg.lora, cfg.privacy, cfg.precision, cfg.trainer)
    family = FAMILIES.get(cfg.model.family)
    vae = VAE_KINDS.get(cfg.vae.kind)
    conditioner = CONDITIONER_KINDS.get(cfg.conditioner.kind)
    check_pretrained_class(cfg)
    if family.check is not None:
        call_with_sections(family.check, cfg)
    check_frames(cfg, family.video, vae.temporal_factor)
    factor = vae.downsample_factor(cfg.vae, False)  # from config files on this machine: nothing downloaded
    if factor is not None:  # else checked as soon as the VAE has loaded (build_components)
        check_resolution(cfg.model, cfg.data, factor)
    require(
        not vae.pretrained or bool(cfg.vae.pretrained),
        "vae.pretrained",
        cfg.vae.pretrained,
        f"`vae.kind={cfg.vae.kind}` needs a hub id or a local path",
        "set `vae.pretrained=...` or use `vae=pixel`",
    )
    require(
        not cfg.lora.enabled or bool(cfg.model.pretrained),
        "model.pretrained",
        cfg.model.pretrained,
        "`lora.enabled=true` fine-tunes a pretrained DiT, and none is set (the base would stay random and frozen)",
        "set `model.pretrained=<hub id or path>` (with `model.subfolder=transformer` for a pipeline repository)",
    )
    require(
        conditioner.condition == family.condition,
        "conditioner.kind",
        cfg.conditioner.kind,
        f"`model.family={cfg.model.family}` is conditioned on {CONDITIONS.get(family.condition, family.condition)}",
        "set `conditioner.kind=class_labels` (with `model.family=dit`)"
        if family.condition == "class"
        else "use a text encoder (`conditioner=minilm` or `t5`), or `model.family=dit` for class labels",
    )
    require(
        family.resolution_shift or not cfg.diffusion.resolution_shift,
        "diffusion.resolution_shift",
        cfg.diffusion.resolution_shift,
        f"it is Flux's schedule (FluxPipeline's sigma grid and mu), and `model.family={cfg.model.family}`'s pipeline "
        "samples another, so an export would not reproduce our sampler",
        "set `diffusion.resolution_shift=false` and a fixed `diffusion.shift` (SD3 and Sana: 3.0)",
    )
    require(
        not cfg.diffusion.resolution_shift or cfg.diffusion.resolution_shift_rule == family.resolution_shift_rule,
        "diffusion.resolution_shift_rule",
        cfg.diffusion.resolution_shift_rule,
        f"`model.family={cfg.model.family}`'s pipeline computes its mu by the {family.resolution_shift_rule} rule, so "
        "an export would not reproduce our sampler with another",
        f"set `diffusion.resolution_shift_rule={family.resolution_shift_rule}`",
    )
    require(
        conditioner.pooling or cfg.conditioner.pooling == "none",
        "conditioner.pooling",
        cfg.conditioner.pooling,
        f"`conditioner.kind={cfg.conditioner.kind}` decides its pooled vector itself (or has none), so it would be "
        "ignored",
        "remove it (`conditioner.pooling=none`), or pool a transformers text encoder (`conditioner.kind=auto`)",
    )
    require(
        conditioner.instruction or not cfg.conditioner.instruction,
        "conditioner.instruction",
        cfg.conditioner.instruction[:1],
        f"`conditioner.kind={cfg.conditioner.kind}` puts no instruction before prompts (Sana's encoder does), so "
        "it would be ignored",
        "remove it (`conditioner.instruction=[]`) or use `conditioner=sana`",
    )
    if conditioner.check is not None:
        call_with_sections(conditioner.check, cfg)
    models = {
        "vae.pretrained": cfg.vae.pretrained if vae.pretrained else None,
        "conditioner.pretrained": cfg.conditioner.pretrained if conditioner.pretrained else None,
        "model.pretrained": cfg.model.pretrained,
    }
    for key, name_or_path in models.items():
        if name_or_path:
            require_offline_copy(str(name_or_path), key)


def check_frames(cfg: TrainConfig, video: bool, temporal_factor: int) -> None:
    """Clips (``data.frames`` > 1) need a family that takes them (``video``), a frame count the VAE's time
    compression divides into whole latent frames (the first alone, then groups of ``temporal_factor``), and the parts
    built for clips: the supervised method and no FID (both read images)."""
    frames = cfg.data.frames
    if frames == 1:
        return
    require(
        video,
        "data.frames",
        frames,
        f"`model.family={cfg.model.family}` is an image family: its transformer takes one frame",
        "set `data.frames=1`, or train a video family (`model.family=wan`)",
    )
    fits = [n for n in range(frames - temporal_factor, frames + temporal_factor + 1) if (n - 1) % temporal_factor == 0]
    require(
        (frames - 1) % temporal_factor == 0,
        "data.frames",
        frames,
        f"`vae.kind={cfg.vae.kind}` encodes the first frame alone, then groups of {temporal_factor}: a clip has "
        f"{temporal_factor} k + 1 frames",
        f"set `data.frames` to one of {', '.join(map(str, fits))}",
    )
    require(
        cfg.trainer.method == "sft",
        "trainer.method",
        cfg.trainer.method,
        "the online methods' rollouts, rewards and image statistics read images, not clips (yet)",
        "train clips with `trainer.method=sft`, or images (`data.frames=1`) with an online method",
    )
    require(
        not cfg.monitor.fid.enabled,
        "monitor.fid.enabled",
        cfg.monitor.fid.enabled,
        "FID compares images' Inception features, and this run samples clips",
        "set `monitor.fid.enabled=false`",
    )


def check_pretrained_class(cfg: TrainConfig) -> None:
    """A ``model.pretrained`` whose config.json (read where it is on this machine) names another transformer class
    than ``model.family``'s is refused before anything loads, naming the family that loads it: loading it as this
    family's class would fail deep in diffusers, or load it half."""
    m = cfg.model
    declared = (pretrained_config(m.pretrained, m.subfolder, m.revision) or {}).get("_class_name")
    expected = FAMILIES.get(m.family).transformer_class.__name__
    if declared is None or declared == expected:
        return
    owners = [name for name in FAMILIES if FAMILIES.get(name).transformer_class.__name__ == declared]
    fix = f"set `model.family={owners[0]}`" if owners else f"point `model.pretrained` at a {expected} folder"
    raise ConfigError(
        "model.pretrained",
        m.pretrained,
        f"its transformer is a {declared} (its config.json says), and `model.family={m.family}` loads {expected}",
        f"{fix}, or check `model.subfolder`",
    )
