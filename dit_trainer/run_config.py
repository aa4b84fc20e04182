"""The one loader of training configs, above every part of the package: what ``train.py``, the scripts and the
tests call to turn a composed Hydra config (or a ``TrainConfig`` built in Python) into a validated ``TrainConfig``,
and to read a run folder's config back.

The order keeps mistakes cheap: the schema's field checks first (no torch, no model, no folder read), then a GRPO
run inherits its init run's settings, a class-conditional run its class folders, every name a registry holds is
looked up (still without torch), and only then does each part of the package check its own sections
(``components``, ``diffusion``, ``data``, ``training``, ``grpo``, ``rewards``), importing what those checks need.
Defaults that depend on a registry entry (LoRA's target modules) are recorded last, so that the saved config says
what was trained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dit_trainer.components import TEXT_ENCODER_KINDS, VAE_KINDS
from dit_trainer.components.families import FAMILIES
from dit_trainer.config import TrainConfig, check_fields, register_configs
from dit_trainer.config.choices import CLASS_LABELS
from dit_trainer.config.resolvers import register_resolvers
from dit_trainer.data import SOURCES
from dit_trainer.diffusion import OBJECTIVES, SAMPLERS
from dit_trainer.errors import ConfigError
from dit_trainer.grpo.init import inherit_init_run, init_checkpoint, starting_weights
from dit_trainer.rewards import REWARDS
from dit_trainer.run_folder import CONFIG


def compose_train_config(config_dir: Path, overrides: list[str]) -> TrainConfig:
    """The validated config ``train.py`` would build from ``overrides``, composed with Hydra's compose API (no
    output folder is made)."""
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=overrides), overrides)


def to_train_config(
    cfg: DictConfig | TrainConfig, overrides: Sequence[str] | None = None, run_dir: Path | None = None
) -> TrainConfig:
    """A composed Hydra config (or a ``TrainConfig`` built in Python) as validated dataclasses, interpolations
    such as ``${asset:shapes_vae}`` resolved. A GRPO run's ``grpo.init_from`` is applied here, once (a run's saved
    config records it in ``grpo.init_weights``); ``overrides`` are the command line's, to tell which values were
    set by hand; ``run_dir`` is the folder the run trains in, whose recorded start a GRPO run keeps."""
    register_resolvers()
    structured = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg))
    check_fields(structured)
    if structured.grpo.init_from and structured.grpo.init_weights is None:
        structured = start_grpo_run(structured, overrides, run_dir)
    return with_lora_targets(validate(with_class_folders(structured)))


def start_grpo_run(cfg: TrainConfig, overrides: Sequence[str] | None, run_dir: Path | None) -> TrainConfig:
    """``cfg`` inheriting its init run. A run folder that already recorded its start (a resumed or requeued run)
    keeps it, whatever the init run has written (or pruned) since: the weights it started from are its own copy."""
    recorded = recorded_start(cfg, run_dir)
    if recorded is not None:
        weights = Path(str(recorded.model.pretrained))
        return inherit_init_run(cfg, recorded, weights, str(recorded.grpo.init_weights), overrides)
    init_dir, checkpoint = init_checkpoint(cfg.grpo.init_from)
    init = read_run_config(init_dir)
    weights = starting_weights(init, cfg.grpo.init_from, init_dir, checkpoint, cfg.grpo.init_ema)
    return inherit_init_run(cfg, init, weights, str(weights), overrides)


def recorded_start(cfg: TrainConfig, run_dir: Path | None) -> TrainConfig | None:
    """The config ``run_dir`` recorded when this GRPO run (the same ``grpo.init_from``) started there, or None."""
    if run_dir is None or not (run_dir / CONFIG).is_file():
        return None
    recorded = read_run_config(run_dir)
    same = recorded.grpo.enabled and recorded.grpo.init_from == cfg.grpo.init_from and recorded.grpo.init_weights
    return recorded if same else None


def with_lora_targets(cfg: TrainConfig) -> TrainConfig:
    """An empty ``lora.target_modules`` is the family's own targets, recorded in the run's saved config: a resume
    or an export later adapts the same modules, whatever the family's defaults have become by then."""
    if cfg.lora.target_modules:
        return cfg
    from dit_trainer.components.families import FAMILIES

    targets = list(FAMILIES.get(cfg.model.family).lora_targets)
    return dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, target_modules=targets))


def with_class_folders(cfg: TrainConfig) -> TrainConfig:
    """A class-conditional run on an image folder of class sub-folders, with ``text_encoder.classes`` unset, gets
    the sub-folder names (sorted, as torchvision numbers them), recorded in its saved config: sampling and export
    later read the classes there, with no data at hand."""
    text, data = cfg.text_encoder, cfg.data
    if text.kind != CLASS_LABELS or text.classes or data.source != "imagefolder" or not data.path:
        return cfg
    from dit_trainer.data.imagefolder import METADATA
    from dit_trainer.images import class_folders

    folder = Path(data.path).expanduser()
    if not folder.is_dir() or (folder / METADATA).is_file():
        return cfg
    return dataclasses.replace(cfg, text_encoder=dataclasses.replace(text, classes=class_folders(folder)))


def check_names(cfg: TrainConfig) -> None:
    """Every name that picks an implementation, against its registry: a typo is answered with the accepted names
    before any implementation (or torch) is imported."""
    for registry, name in (
        (FAMILIES, cfg.model.family),
        (VAE_KINDS, cfg.vae.kind),
        (TEXT_ENCODER_KINDS, cfg.text_encoder.kind),
        (SOURCES, cfg.data.source),
        (OBJECTIVES, cfg.diffusion.objective),
        (SAMPLERS, cfg.diffusion.sampler),
    ):
        registry.check(name)
    for position, entry in enumerate(cfg.data.mixture):
        SOURCES.check(entry.source, f"data.mixture[{position}].source")
    for name in cfg.reward.weights:
        REWARDS.check(name, f"reward.weights.{name}")


def validate(cfg: TrainConfig) -> TrainConfig:
    """The field checks, the names, then each part's checks of its own sections; the first failure is one
    ``ConfigError`` paragraph naming the key, the value, what is accepted and the fix. Returns ``cfg``."""
    check_fields(cfg)
    check_names(cfg)
    # The parts' checks import torch and the model libraries: only once the fields are known to be good.
    from dit_trainer.components.checks import check_components
    from dit_trainer.data.checks import check_data
    from dit_trainer.diffusion.checks import check_diffusion
    from dit_trainer.grpo.checks import check_grpo
    from dit_trainer.rewards.build import check_rewards
    from dit_trainer.training.checks import check_training

    for check in (check_components, check_diffusion, check_data, check_training, check_grpo, check_rewards):
        check(cfg)
    return cfg


def first_interpolation(node: Any, key: str = "") -> tuple[str, str] | None:
    """The dotted key and text of the first ``${...}`` in a plain (unresolved) config tree, or None."""
    if isinstance(node, dict):
        children = ((f"{key}.{name}" if key else str(name), child) for name, child in node.items())
    elif isinstance(node, list):
        children = ((f"{key}[{index}]", child) for index, child in enumerate(node))
    else:
        return (key, node) if isinstance(node, str) and "${" in node else None
    for child_key, child in children:
        found = first_interpolation(child, child_key)
        if found is not None:
            return found
    return None


def refuse_interpolations(saved: DictConfig, config_path: Path) -> None:
    """Refuse a run config holding an interpolation, before anything resolves it.

    ``train.py`` writes ``config.yaml`` with every interpolation resolved, so one in it was added by hand or by
    another tool, and resolving it is not safe: ``${oc.env:NAME}`` reads an environment variable (a token, a
    password) into the config, and a resolver such as ``${package_model:MODULE}`` imports a module, running its
    code. Refusing is clearer than keeping the text literally, which would only fail later as a strange model path
    or prompt.
    """
    found = first_interpolation(OmegaConf.to_container(saved, resolve=False))
    if found is not None:
        key, text = found
        raise ConfigError(
            key,
            text,
            f"{config_path} must hold plain values (train.py writes it with every interpolation resolved), and "
            "resolving one from a run folder could read environment variables or import code",
            f"replace the interpolation in {config_path} with the value it stands for, then run again",
        )


def read_run_config(run_dir: Path) -> TrainConfig:
    """The validated config a run folder was trained with; interpolations in it are refused, never resolved."""
    config_path = run_dir / CONFIG
    if not config_path.is_file():
        raise ConfigError(
            "run_dir",
            str(run_dir),
            f"it holds no {CONFIG}, so it is not a dit-trainer run folder",
            "pass the folder train.py wrote (its hydra.run.dir)",
        )
    saved = OmegaConf.load(config_path)
    refuse_interpolations(saved, config_path)
    try:
        return to_train_config(saved)
    except OmegaConfBaseException as error:  # a setting renamed, removed or retyped since the run was trained
        key, reason = error.full_key or CONFIG, str(error).partition("\n")[0]
        raise ConfigError(
            key,
            OmegaConf.select(saved, error.full_key, default=None) if error.full_key else None,
            f"this version of dit-trainer does not accept it in {config_path} ({reason}; "
            "the file was written by another version, or edited)",
            f"edit that key in {config_path} to the current setting (`python train.py --cfg job` prints them "
            "all) or remove it, then run again",
        ) from None
