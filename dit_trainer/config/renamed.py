"""Keys that moved, still read from their old place so that recipes, job scripts and run folders written before the
move keep working: each is moved to its new key with a warning naming it, and the saved config records only the new.

``grpo.enabled=true`` became ``trainer.method=grpo`` when training methods got one seam (a second method would
otherwise need a second flag, and two flags can both be on); ``grpo.init_from`` / ``grpo.init_ema`` became
``trainer.init_from`` / ``trainer.init_ema`` because starting from another run is not GRPO's alone; ``monitor.grpo``
became ``monitor.reward``, since it watches the reward of any run, supervised ones first; ``text_encoder`` (the
section and its config group) became ``conditioner``, since class labels and a family's set of encoders condition a
DiT as well.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from omegaconf import OmegaConf

from dit_trainer.config.conditioner import ConditionerConfig, RenamedTextEncoder
from dit_trainer.config.monitors import RenamedRewardMonitor
from dit_trainer.config.schema import TrainConfig
from dit_trainer.errors import ConfigError

logger = logging.getLogger(__name__)


def move_renamed_keys(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with each old key's value at its new key (a conflicting value at both is refused)."""
    return _move_method_keys(_move_reward_monitor(_move_text_encoder(cfg)))


def _move_text_encoder(cfg: TrainConfig) -> TrainConfig:
    """``text_encoder.*`` set on a command line or in a recipe moved to ``conditioner.*``, each field set there
    overriding the new section's. An option of the old group (``text_encoder=t5``) replaces the whole section, as a
    group option always did: its settings and the old keys set with it, on the schema's defaults; what else the
    section held (a recipe's conditioner, ``conditioner.KEY``) is dropped, and the warning names it."""
    old = cfg.text_encoder
    moved = {f.name: getattr(old, f.name) for f in dataclasses.fields(old) if getattr(old, f.name) is not None}
    group = moved.pop("group", None)
    if not moved and group is None:
        return cfg
    if group is None:
        _warn(", ".join(f"`text_encoder.{key}` -> `conditioner.{key}`" for key in moved))
        return dataclasses.replace(
            cfg, conditioner=dataclasses.replace(cfg.conditioner, **moved), text_encoder=RenamedTextEncoder()
        )
    conditioner = dataclasses.replace(_resolved(ConditionerConfig()), **moved)
    dropped = [
        f"`conditioner.{f.name}={getattr(cfg.conditioner, f.name)!r}`"
        for f in dataclasses.fields(conditioner)
        if getattr(cfg.conditioner, f.name) != getattr(conditioner, f.name) and f.name not in moved
    ]
    note = (
        f"; as an option of the old group it replaced the whole section, dropping {', '.join(dropped)}"
        if dropped
        else ""
    )
    _warn(f"`text_encoder={group}` -> `conditioner={group}` (and `text_encoder.KEY` -> `conditioner.KEY`){note}")
    return dataclasses.replace(cfg, conditioner=conditioner, text_encoder=RenamedTextEncoder())


def _resolved(section: ConditionerConfig) -> ConditionerConfig:
    """A section with its interpolations resolved (the default conditioner's MiniLM path), as a composed one is."""
    return OmegaConf.to_object(OmegaConf.structured(section))


def _move_reward_monitor(cfg: TrainConfig) -> TrainConfig:
    """``monitor.grpo.*`` set (on a command line, in a recipe or a run folder's config of before the rename) moved
    to ``monitor.reward.*``, each field set there overriding the new section's."""
    old = cfg.monitor.grpo
    moved = {f.name: getattr(old, f.name) for f in dataclasses.fields(old) if getattr(old, f.name) is not None}
    if not moved:
        return cfg
    _warn(", ".join(f"`monitor.grpo.{key}` -> `monitor.reward.{key}`" for key in moved))
    reward = dataclasses.replace(cfg.monitor.reward, **moved)
    monitor = dataclasses.replace(cfg.monitor, reward=reward, grpo=RenamedRewardMonitor())
    return dataclasses.replace(cfg, monitor=monitor)


def _warn(keys: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        logger.warning(f"renamed config keys, read from their old place this time: {keys}")


def _move_method_keys(cfg: TrainConfig) -> TrainConfig:
    old, trainer = cfg.grpo, cfg.trainer
    moved: dict[str, object] = {}
    if old.enabled:
        if trainer.method not in ("sft", "grpo"):
            raise ConfigError(
                "grpo.enabled",
                True,
                f"it is the earlier spelling of `trainer.method=grpo`, and `trainer.method={trainer.method}` names "
                "another method",
                "drop `grpo.enabled` and name the method once, in `trainer.method`",
            )
        moved["method"] = "grpo"
    if old.init_from is not None:
        if trainer.init_from not in (None, old.init_from):
            raise ConfigError(
                "grpo.init_from",
                old.init_from,
                f"it is the earlier spelling of `trainer.init_from`, which is set to {trainer.init_from!r}",
                "drop `grpo.init_from` and set only `trainer.init_from`",
            )
        moved["init_from"] = old.init_from
    if old.init_ema is False:  # an earlier config.yaml records the old default (true), which says nothing
        moved["init_ema"] = False
    if old.init_weights is not None:
        moved["init_weights"] = old.init_weights
    grpo = dataclasses.replace(old, enabled=False, init_from=None, init_ema=None, init_weights=None)
    if not moved:
        return dataclasses.replace(cfg, grpo=grpo)
    _warn(", ".join(f"`grpo.{'enabled' if key == 'method' else key}` -> `trainer.{key}`" for key in moved))
    return dataclasses.replace(cfg, trainer=dataclasses.replace(trainer, **moved), grpo=grpo)


def move_renamed_keys_in_saved(config: dict) -> dict:
    """A config as a checkpoint written before a move recorded it (a plain dict), its old keys moved as
    ``move_renamed_keys`` moves them: a resume then compares like with like."""
    return _move_method_keys_in_saved(_move_reward_monitor_in_saved(move_renamed_sections_in_saved(config)))


def move_renamed_sections_in_saved(config: dict) -> dict:
    """A saved config's whole sections under their new names (``text_encoder`` -> ``conditioner``): done before a
    run folder's config meets the command line's keys, so that those keys (``conditioner.KEY``) win as they would
    over a folder written after the rename."""
    if "conditioner" in config or "text_encoder" not in config:
        return config
    return {**config, "conditioner": config["text_encoder"], "text_encoder": dataclasses.asdict(RenamedTextEncoder())}


def _move_reward_monitor_in_saved(config: dict) -> dict:
    monitor = dict(config.get("monitor", {}))
    if "reward" in monitor or "grpo" not in monitor:
        return config
    monitor["reward"], monitor["grpo"] = monitor["grpo"], dataclasses.asdict(RenamedRewardMonitor())
    return {**config, "monitor": monitor}


def _move_method_keys_in_saved(config: dict) -> dict:
    if "method" in config.get("trainer", {}):  # written after the method seam
        return config
    grpo, trainer = dict(config.get("grpo", {})), dict(config.get("trainer", {}))
    trainer["method"] = "grpo" if grpo.get("enabled") else "sft"
    trainer["init_from"] = grpo.get("init_from")
    trainer["init_ema"] = grpo.get("init_ema", True)
    trainer["init_weights"] = grpo.get("init_weights")
    grpo.update(enabled=False, init_from=None, init_ema=None, init_weights=None)
    return {**config, "trainer": trainer, "grpo": grpo}
