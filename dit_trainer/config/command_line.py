"""The command line checked against the schema before Hydra composes it: a mistyped key or config option is one
paragraph naming it and the closest valid ones, and a value whose braces the shell stripped of their quotes (a shard
pattern) one paragraph naming the quoting that works (exit 2), in the time it takes to import Hydra, instead of
Hydra's own message and exit 1."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from dit_trainer.config.schema import TrainConfig
from dit_trainer.errors import ConfigError

EXPERIMENT = "experiment"  # the group `+experiment=NAME` picks
# A word of a list or dict value that holds a brace pattern (`/data/{000000..000099}.tar`, not a dict's braces).
BRACE_WORD = re.compile(r"(?<![\w'\"/.:-])[^\s,\[\]{}'\"]*\{[^{}\s,:'\"]*\}[^\s,\[\]{}'\"]*")


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


def _split_sweep(value: str) -> list[str] | None:
    """``value`` cut at its commas outside braces (a multirun sweep's values; one part otherwise), None when its
    braces do not pair."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(value):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return None
        if char == "," and depth == 0:
            parts.append(value[start:index])
            start = index + 1
    return [*parts, value[start:]] if depth == 0 else None


def _quoted_value(value: str, inner: str) -> str | None:
    """``value`` with what holds braces in ``inner`` quotes: in a list or dict each word that holds a brace pattern
    (``path: '/x/{0..9}.tar'``), else the value (each value of a multirun sweep). None when that cannot be written."""
    if value[:1] == "[" or (value[:1] == "{" and ":" in value):
        return BRACE_WORD.sub(lambda word: f"{inner}{word.group(0)}{inner}", value)
    parts = _split_sweep(value)
    if parts is None or any(inner in part for part in parts):
        return None
    return ",".join(f"{inner}{part}{inner}" for part in parts)


def unquoted_braces(item: str, parser: OverridesParser) -> ConfigError | None:
    """The refusal of an override Hydra cannot parse because its value holds braces Hydra reads as a dict's (a shard
    pattern, ``data.path=/data/shards/{000000..000099}.tar``: the shell removed the quotes it was typed with), when
    quoting them makes it parse; it names the quoting that works. None for any other syntax error (Hydra's own)."""
    name, _, value = item.partition("=")
    if "{" not in value and "}" not in value:
        return None
    inner, outer = ('"', "'") if "$" in value else ("'", '"')  # no `${...}` inside a shell's double quotes
    quoted = _quoted_value(value, inner)
    if quoted is None or outer in quoted:
        return None
    try:
        parser.parse_override(f"{name}={quoted}")
    except HydraException:
        return None
    return ConfigError(
        name.lstrip("+~"),
        value,
        "Hydra's override grammar reads `{` and `}` outside quotes as a dict's braces, so a value that holds them "
        "(a shard pattern such as `{000000..000099}`) must reach Hydra in quotes, and the shell removed the quotes "
        "it was typed with",
        f"quote the value for Hydra and the whole override for the shell: `{outer}{name}={quoted}{outer}`",
    )


def check_command_line(argv: list[str], config_dir: Path) -> None:
    """Refuse an override whose key the schema does not have, a config group option that does not exist, or a value
    whose braces lost their quotes in the shell (``unquoted_braces``). Hydra's flags (``--cfg``, ``-m``, ...),
    ``hydra.*`` settings and any other syntax error are left to Hydra."""
    groups = {path.name for path in config_dir.iterdir() if path.is_dir()}
    parser = OverridesParser.create()
    keys = list(schema_keys())
    for item in argv:
        if item.startswith("-") or "=" not in item:
            continue
        try:
            override = parser.parse_override(item)
        except HydraException:
            if (unquoted := unquoted_braces(item, parser)) is not None:
                raise unquoted from None
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
