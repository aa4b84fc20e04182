"""The command line checked against the schema before Hydra composes it: a mistyped key or config option is one
paragraph naming it and the closest valid ones, a value of the wrong type (``optim.lr=abc``) one paragraph naming the
type the field takes, and a value whose braces the shell stripped of their quotes (a shard pattern) one paragraph
naming the quoting that works (exit 2), in the time it takes to import Hydra, instead of Hydra's own message and
exit 1. Shell completion (``-sc install=bash``, and the queries the installed script makes) is Hydra's alone."""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from dit_trainer.config.fields import CHECK, Check
from dit_trainer.config.schema import TrainConfig
from dit_trainer.errors import ConfigError

EXPERIMENT = "experiment"  # the group `+experiment=NAME` picks
COMPLETION_FLAGS = ("-sc", "--shell-completion")  # Hydra's: its `install=bash` / `query=bash` are not overrides
# What each type of field takes, and a value to show when the field's default is not one.
KINDS = {bool: ("true or false", "true"), int: ("a whole number", "1"), float: ("a number", "0.5"),
         str: ("text", "text"), list: ("a list", "[a,b]"), dict: ("a mapping", "{name: 1.0}")}  # fmt: skip
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


def _indexes_a_list(key: str) -> bool:
    """Whether ``key`` reaches into a list by position (``data.mixture.0.weight``): the schema's list is empty until
    an experiment fills it, so only the composed config can judge the value."""
    return any(part.isdigit() for part in key.split("."))


def _field(key: str, schema: type = TrainConfig) -> tuple[Any, Any, Check | None]:
    """The type, the default and the check of the ``schema`` field ``key`` (below a dict field: the dict's value
    type, no default, no check)."""
    node: Any = schema()
    hint: Any = schema
    check = None
    for part in key.split("."):
        if dataclasses.is_dataclass(node):
            spec = next(spec for spec in dataclasses.fields(node) if spec.name == part)
            hint, node, check = typing.get_type_hints(type(node))[part], getattr(node, part), spec.metadata.get(CHECK)
        else:
            hint, node, check = (typing.get_args(hint) or (Any, Any))[-1], None, None
    return hint, node, check


def _kind(hint: Any) -> tuple[str, str, bool]:
    """What a field of type ``hint`` takes in words, an example value, and whether it is one plain value."""
    args = typing.get_args(hint)
    optional = isinstance(hint, types.UnionType) and type(None) in args
    if optional:
        hint = next(arg for arg in args if arg is not type(None))
    origin = typing.get_origin(hint) or hint
    words, example = KINDS.get(origin, ("a section of settings" if dataclasses.is_dataclass(origin) else "", None))
    if any(dataclasses.is_dataclass(arg) for arg in typing.get_args(hint)):  # a list of sections: no short example
        example = None
    return (f"{words} or null" if optional else words), example, origin in (bool, int, float, str)


def wrong_type(override: Override, key: str, config: DictConfig) -> ConfigError | None:
    """The refusal of an override whose value the schema field ``key`` cannot take (``optim.lr=abc``), judged by
    OmegaConf's own conversion, as Hydra applies it to ``config`` (a structured ``TrainConfig``); None when it takes
    every value given (a multirun sweep's each)."""
    if override.is_sweep_override():
        values = list(override.sweep_iterator()) if override.is_choice_sweep() else []
    else:
        values = [override.value()]
    for value in values:
        try:
            OmegaConf.update(config, key, value, merge=True, force_add=override.is_force_add())
        except ValidationError as error:
            return refused_value(key, value, error)
        except ConfigKeyError as error:  # a dict or list value naming a key the field has not (`{source:x,pth:y}`)
            return ConfigError(
                key,
                value,
                f"it names a key that `{key}` has not ({str(error).partition(chr(10))[0]})",
                f"name only keys that `{key}` has (`python train.py --help` lists every field and what it takes)",
            )
    return None


def refused_value(
    key: str,
    value: Any,
    error: ValidationError,
    schema: type = TrainConfig,
    fields_shown: str = "`python train.py --help`",
) -> ConfigError:
    """The one paragraph for a ``value`` that OmegaConf could not convert to the type of the ``schema`` field
    ``key``: what the field takes and an example: its default where it has one, else its check's fix (a value the
    field is meant to take, not any value of its type: a guidance scale of 3, not 0.5), else where ``fields_shown``."""
    hint, default, check = _field(key, schema)
    words, example, plain = _kind(hint)
    reason = str(error).partition("\n")[0].rstrip(".")
    accepted = f"it must be {words}" + ("" if plain else f" ({reason})") if words else reason
    if isinstance(default, bool | int | float):
        example = str(default).lower() if isinstance(default, bool) else repr(default)
    elif check is not None and check.fix:
        return ConfigError(key, value, accepted, check.fix.format(key=key))
    fix = f"set e.g. `{key}={example}`" if example else f"see its fields in {fields_shown}"
    return ConfigError(key, value, accepted, fix)


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


def defaults_groups(config_dir: Path) -> set[str]:
    """The config groups ``train.yaml``'s defaults list names (``experiment`` is not among them: it is added)."""
    entries = OmegaConf.load(config_dir / "train.yaml").get("defaults", [])
    return {name for entry in entries if isinstance(entry, DictConfig) for name in entry}


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


def parsed_overrides(argv: list[str]) -> Iterator[tuple[str, Override | None]]:
    """Each ``key=value`` item of a command line (flags and bare words skipped) with Hydra's parse of it, None for
    one Hydra cannot parse (the caller decides who reports it)."""
    parser = OverridesParser.create()
    for item in argv:
        if item.startswith("-") or "=" not in item:
            continue
        try:
            override = parser.parse_override(item)
        except HydraException:
            override = None
        yield item, override


def _parses(parser: OverridesParser, item: str) -> bool:
    """Whether Hydra parses ``item``: a fix offered for one it cannot must be one it can."""
    try:
        parser.parse_override(item)
    except HydraException:
        return False
    return True


def unquoted_braces(item: str, parser: OverridesParser) -> ConfigError | None:
    """The refusal of an override Hydra cannot parse because its value holds braces Hydra reads as a dict's (a shard
    pattern, ``data.path=/data/shards/{000000..000099}.tar``: the shell removed the quotes it was typed with), when
    quoting them makes it parse; it names the quoting that works. None for any other syntax error (Hydra's own)."""
    name, _, value = item.partition("=")
    if "{" not in value and "}" not in value:
        return None
    inner, outer = ('"', "'") if "$" in value else ("'", '"')  # no `${...}` inside a shell's double quotes
    quoted = _quoted_value(value, inner)
    if quoted is None or outer in quoted or not _parses(parser, f"{name}={quoted}"):
        return None
    return ConfigError(
        name.lstrip("+~"),
        value,
        "Hydra's override grammar reads `{` and `}` outside quotes as a dict's braces, so a value that holds them "
        "(a shard pattern such as `{000000..000099}`) must reach Hydra in quotes, and the shell removed the quotes "
        "it was typed with",
        f"quote the value for Hydra and the whole override for the shell: `{outer}{name}={quoted}{outer}`",
    )


def expanded_braces(argv: list[str]) -> ConfigError | None:
    """The refusal of one key given several times with paths that differ only in their numbers: the shell expanded a
    brace pattern typed without quotes (``data.path=/d/{000000..000003}.tar`` became four overrides) and Hydra would
    keep the last (one shard) without a word. None otherwise (a number given again changes it, as in Hydra)."""
    values: dict[str, list[str]] = {}
    for item in argv:
        name, equals, value = item.partition("=")
        if equals and not name.startswith(("-", "hydra")):
            values.setdefault(name, []).append(value)
    for name, given in values.items():
        patterns = {re.sub(r"\d+", "#", value) for value in given}
        if len(set(given)) > 1 and len(patterns) == 1 and "/" in patterns.pop():  # paths: a number may be changed
            return ConfigError(
                name.lstrip("+~"),
                given,
                f"it is given {len(given)} times, with values that differ only in their numbers: the shell expanded "
                "a brace pattern typed without quotes, and Hydra would keep only the last value",
                f"quote the pattern for Hydra and the override for the shell, e.g. `\"{name}='/data/shards/"
                "{000000..000099}.tar'\"`",
            )
    return None


def unquoted_home(item: str, parser: OverridesParser) -> ConfigError | None:
    """The refusal of an override Hydra cannot parse because its value starts with ``~`` (a home folder the shell
    left unexpanded: typed in quotes), when writing the home folder out makes it parse. None otherwise."""
    name, _, value = item.partition("=")
    home = value == "~" or value.startswith("~/")
    if not home or not _parses(parser, f"{name}={Path(value).expanduser()}"):
        return None
    return ConfigError(
        name.lstrip("+~"),
        value,
        "Hydra's override grammar does not take `~` at the start of a value, and the shell passed it on unexpanded "
        "(it expands `~` only outside quotes)",
        f"write the home folder out: `{name}=$HOME{value[1:]}` (unquoted, or in double quotes)",
    )


def check_command_line(argv: list[str], config_dir: Path) -> None:
    """Refuse an override whose key the schema does not have, a config group option that does not exist, a value
    its field cannot take (``wrong_type``), or a value whose braces lost their quotes in the shell
    (``unquoted_braces``) or that starts with a ``~`` the shell left (``unquoted_home``). Hydra's flags (``--cfg``,
    ``-m``, ...), shell completion, ``hydra.*`` settings and any other syntax error are left to Hydra."""
    if any(flag in argv for flag in COMPLETION_FLAGS):
        return
    groups = {path.name for path in config_dir.iterdir() if path.is_dir()}
    defaults = defaults_groups(config_dir)
    keys = list(schema_keys())
    config: DictConfig | None = None  # the schema as Hydra composes onto it, built for the first value to check
    if (expanded := expanded_braces(argv)) is not None:
        raise expanded
    for item, override in parsed_overrides(argv):
        if override is None:
            parser = OverridesParser.create()
            if (unquoted := unquoted_braces(item, parser) or unquoted_home(item, parser)) is not None:
                raise unquoted from None
            continue  # Hydra reports its own syntax errors
        key = override.key_or_group
        if key.startswith("hydra") or override.is_delete() or "[" in key:
            continue
        if key in groups and isinstance(override.value(), str):
            _check_option(key, override.value(), config_dir, "+" if override.is_add() else "")
            if key not in defaults and not override.is_add():  # Hydra: "No match in the defaults list", exit 1
                raise ConfigError(
                    key,
                    override.value(),
                    f"configs/train.yaml's defaults list has no `{key}` entry, so its option is added, not replaced",
                    f"write `+{key}={override.value()}`",
                )
        elif not _known(key):  # `+` too: Hydra adds the key, and the schema's loader drops it without a word
            closest = " or ".join(f"`{candidate}`" for candidate in closest_keys(key, keys))
            added = " (a `+` adds keys only below a field that takes any, such as `model.extra_config`)"
            raise ConfigError(
                key,
                override.value(),
                "the config has no such key"
                + (f" (the closest are {closest})" if closest else "")
                + (added if override.is_add() else ""),
                "correct the key; `python train.py --cfg job` prints every key with its value",
            )
        elif key not in groups and not override.is_add() and not _indexes_a_list(key):
            config = OmegaConf.structured(TrainConfig) if config is None else config
            if (refused := wrong_type(override, key, config)) is not None:
                raise refused
