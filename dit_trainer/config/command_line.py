"""The command line checked against the schema before Hydra composes it: a mistyped key or config option is one
paragraph naming it and the closest valid ones (exit 2), in the time it takes to import Hydra, instead of Hydra's
own message and exit 1."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from dit_trainer.config.schema import TrainConfig
from dit_trainer.errors import ConfigError

EXPERIMENT = "experiment"  # the group `+experiment=NAME` picks


def schema_keys(node: Any = None, prefix: str = "") -> Iterator[str]:
    """Every dotted key of the schema, sections and fields (``trainer``, ``trainer.max_steps``, ...)."""
    node = TrainConfig() if node is None else node
    for spec in dataclasses.fields(node):
        key = f"{prefix}{spec.name}"
        yield key
        value = getattr(node, spec.name)
        if dataclasses.is_dataclass(value):
            yield from schema_keys(value, f"{key}.")


def _known(key: str) -> bool:
    """Whether ``key`` names a field of the schema (keys below a field that holds a dict, a list or any value, such
    as ``reward.weights.clip_score``, are the field's own to accept)."""
    node: Any = TrainConfig()
    for part in key.split("."):
        if not dataclasses.is_dataclass(node):
            return True
        if part not in {spec.name for spec in dataclasses.fields(node)}:
            return False
        node = getattr(node, part)
    return True


def closest_keys(key: str, keys: list[str]) -> list[str]:
    """The schema keys ``key`` most likely meant: those whose last part is close to ``key``'s (``trainer.lrr`` ->
    ``optim.lr``), those in the same section first, else the closest whole keys."""
    section, _, name = key.rpartition(".")
    names = {candidate: candidate.rpartition(".")[2] for candidate in keys}
    close = difflib.get_close_matches(name, sorted(set(names.values())), n=5, cutoff=0.6)
    ranked = sorted(
        (candidate for candidate, last in names.items() if last in close),
        key=lambda candidate: (close.index(names[candidate]), candidate.rpartition(".")[0] != section),
    )
    return ranked[:3] or difflib.get_close_matches(key, keys, n=3, cutoff=0.5)


def _check_option(group: str, option: str, config_dir: Path, prefix: str = "") -> None:
    options = sorted(path.stem for path in (config_dir / group).glob("*.yaml"))
    if option in options or option in ("null", "None"):
        return
    close = difflib.get_close_matches(option, options, n=1, cutoff=0.5)
    raise ConfigError(
        group,
        option,
        f"configs/{group}/ has no option `{option}` (options: {', '.join(options)})",
        f"pick one, e.g. `{prefix}{group}={(close or options)[0]}`",
    )


def check_command_line(argv: list[str], config_dir: Path) -> None:
    """Refuse an override whose key the schema does not have, or a config group option that does not exist.
    Hydra's flags (``--cfg``, ``-m``, ...), ``hydra.*`` settings and anything this cannot parse are left to Hydra."""
    groups = {path.name for path in config_dir.iterdir() if path.is_dir()}
    parser = OverridesParser.create()
    keys = list(schema_keys())
    for item in argv:
        if item.startswith("-") or "=" not in item:
            continue
        try:
            override = parser.parse_override(item)
        except HydraException:
            continue  # Hydra reports its own syntax errors
        key = override.key_or_group
        if key.startswith("hydra") or override.is_delete() or "[" in key:
            continue
        if key in groups and isinstance(override.value(), str):
            _check_option(key, override.value(), config_dir, "+" if override.is_add() else "")
        elif not override.is_add() and not _known(key):
            closest = " or ".join(f"`{candidate}`" for candidate in closest_keys(key, keys))
            raise ConfigError(
                key,
                override.value(),
                "the config has no such key" + (f" (the closest are {closest})" if closest else ""),
                "correct the key; `python train.py --cfg job` prints every key with its value",
            )
