"""Calling a part with the config sections it reads.

A part's hook (a family's or a conditioner's check, a method's answers to the composition root) names the sections
it reads as its parameters (``model: ModelConfig``, ``diffusion: DiffusionConfig``), and its caller hands it those
sections of the run's config, by name. The signature is then the part's whole dependency on the config: no part reads
a section it does not name, and a test builds only the sections a hook takes.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

Result = TypeVar("Result")


def call_with_sections(
    hook: Callable[..., Result], config: Any, roles: Mapping[str, str] | None = None, **given: Any
) -> Result:
    """``hook`` called with what its parameters name: of ``given`` (what the caller offers), else the section of
    ``config`` (a dataclass of sections: the run config) by that key, or by the key ``roles`` maps that name to. A
    parameter that is none of these keeps its default."""
    sections = {field.name for field in dataclasses.fields(config)}
    keys = {name: name for name in sections} | dict(roles or {})
    arguments = {}
    for name in inspect.signature(hook).parameters:
        if name in given:
            arguments[name] = given[name]
        elif name in keys:
            arguments[name] = getattr(config, keys[name])
    return hook(**arguments)
