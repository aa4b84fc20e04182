"""Single-field checks, declared beside their fields: ``lr: float = positive(1e-4)``.

Each helper returns a ``dataclasses.field`` whose metadata carries a ``Check``; OmegaConf reads only a field's type
and default, so the schema stays a plain structured config. ``check_fields`` walks a config and raises one
``ConfigError`` paragraph for the first value that fails its check. ``None`` passes where a field is typed
``X | None`` (it means "not set"); a field typed ``Any`` (``data.buckets``) checks it like any value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from dit_trainer.errors import ConfigError

CHECK = "check"


@dataclass(frozen=True)
class Check:
    """``test(value)`` must hold; otherwise ``accepted()`` says what would, and ``fix`` (``{key}`` is filled in)
    how to get there. ``accepted`` is a callable so that choices read from a registry are listed as they are when
    the check fails, not when the schema was imported."""

    test: Callable[[Any], bool]
    accepted: Callable[[], str]
    fix: str | None = None


def checked(
    test: Callable[[Any], bool],
    accepted: str | Callable[[], str],
    fix: str | None = None,
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with a ``Check`` (the building block of the helpers below)."""
    describe = accepted if callable(accepted) else (lambda: accepted)
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={CHECK: Check(test, describe, fix)}
    )


def _rule(rule: str, note: str | None) -> str:
    """``it must be > 0 (1 means no shift)``: the rule, and what its edge values mean for this field."""
    return f"{rule} ({note})" if note else rule


def at_least(minimum: float, default: Any, fix: str | None = None, note: str | None = None) -> Any:
    """A number >= ``minimum`` (whole-number fields are typed ``int``, which OmegaConf enforces)."""
    fix = fix or f"set e.g. `{{key}}={minimum}`"
    return checked(lambda value: value >= minimum, _rule(f"it must be >= {minimum}", note), fix, default)


def positive(default: Any, fix: str | None = None, note: str | None = None) -> Any:
    return checked(lambda value: value > 0, _rule("it must be > 0", note), fix, default)


def finite(minimum: float, default: Any, fix: str, above: bool = False) -> Any:
    """A finite number >= ``minimum`` (``above``: > it): a rate or a weight where infinity trains NaN from step 2."""
    rule = f"it must be a finite number {'>' if above else '>='} {minimum:g}"
    return checked(
        lambda value: (value > minimum if above else value >= minimum) and value < math.inf, rule, fix, default
    )


def fraction(default: Any, fix: str | None = None, note: str | None = None) -> Any:
    """A probability-like value in [0, 1): a dropout rate, a decay."""
    return checked(lambda value: 0 <= value < 1, _rule("it must be in [0, 1)", note), fix, default)


def open_unit(default: Any, note: str | None = None) -> Any:
    return checked(lambda value: 0 < value < 1, _rule("it must be in (0, 1)", note), None, default)


def between(low: float, high: float, default: Any) -> Any:
    return checked(lambda value: low <= value <= high, f"it must be between {low} and {high}", None, default)


def one_of(choices: Collection[str], default: Any) -> Any:
    """One of ``choices``: a tuple beside the field, or a registry dict whose keys are the names."""
    return checked(
        lambda value: value in choices,
        lambda: f"accepted values are {', '.join(choices)}",
        f"set e.g. `{{key}}={next(iter(choices))}`",
        default,
    )


def non_empty(
    default_factory: Callable[[], list], accepted: str = "at least one entry is needed", fix: str | None = None
) -> Any:
    return checked(bool, accepted, fix, default_factory=default_factory)


def check_fields(config: Any, prefix: str = "") -> None:
    """Every field check of ``config`` and of the dataclasses nested in it; the first failure is a
    ``ConfigError`` naming the full key (``trainer.batch_size``)."""
    for key, value, check, optional in _checked_values(config, prefix):
        if not (value is None and optional) and not check.test(value):
            fix = check.fix.format(key=key) if check.fix else None
            raise ConfigError(key, _plain(value), check.accepted(), fix)


def _checked_values(config: Any, prefix: str) -> Iterable[tuple[str, Any, Check, bool]]:
    """(key, value, check, whether the field's type admits None) of every checked field."""
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        key = f"{prefix}{spec.name}"
        if dataclasses.is_dataclass(value):
            yield from _checked_values(value, f"{key}.")
        elif isinstance(value, list) and value and all(dataclasses.is_dataclass(item) for item in value):
            for index, item in enumerate(value):
                yield from _checked_values(item, f"{key}[{index}].")
        elif CHECK in spec.metadata:
            yield key, value, spec.metadata[CHECK], "None" in str(spec.type)


def _plain(value: Any) -> Any:
    """Lists and dicts as Python builtins in messages (OmegaConf hands over its own containers)."""
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list | tuple):
        return list(value)
    return value
