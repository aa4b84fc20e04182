"""What a transformer class's constructor argument accepts, read from its signature, so that a wrong
``model.extra_config`` value is refused at the config check instead of failing in diffusers after the models load.

The annotation says it (``int``, ``float``, ``bool``, ``str``, ``tuple[int, ...]``, ``X | None``, ``Literal[...]``);
an argument without one (or with one that does not resolve) takes its default's type, a number for a numeric
default (an unannotated ``mlp_ratio=4`` may well be 2.5) and anything for a default of None. Values come from YAML
or the command line: ints, floats, bools, strings, null, and lists or dicts (OmegaConf's or plain), so a list stands
for a tuple and an int for a float.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

NoneType = type(None)
NAMES = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    NoneType: "null",
    Any: "any value",
}
PLURALS = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}


def constructor_parameters(transformer_class: type) -> Mapping[str, inspect.Parameter]:
    """The constructor's parameters with their annotations resolved where they can be (a class written with
    ``from __future__ import annotations`` has strings there)."""
    try:
        return inspect.signature(transformer_class.__init__, eval_str=True).parameters
    except Exception:  # noqa: BLE001 (an annotation naming what its module does not import: read the defaults)
        return inspect.signature(transformer_class.__init__).parameters


def expected_type(parameter: inspect.Parameter) -> Any:
    """The type a value of ``parameter`` must have (``Any``: nothing is known to check against)."""
    if parameter.annotation is not inspect.Parameter.empty and not isinstance(parameter.annotation, str):
        return parameter.annotation
    default = parameter.default
    if default is inspect.Parameter.empty or default is None:
        return Any
    if isinstance(default, bool | str):
        return type(default)
    if isinstance(default, int | float):
        return float
    if isinstance(default, tuple | list):
        kinds = {expected_type(inspect.Parameter("item", inspect.Parameter.POSITIONAL_ONLY, default=item))
                 for item in default}  # fmt: skip
        return tuple[kinds.pop() if len(kinds) == 1 else Any, ...]
    return type(default)


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def fits(value: Any, kind: Any) -> bool:
    """Whether ``value`` (from YAML or the command line) is a ``kind``."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if kind in (None, NoneType):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind in (tuple, list) or origin in (tuple, list, Sequence):
        if not _is_list(value):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(fits(item, arg) for item, arg in zip(value, args))
        return not args or all(fits(item, args[0]) for item in value)
    if kind is dict or origin in (dict, Mapping):
        return isinstance(value, Mapping) and (not args or all(fits(item, args[1]) for item in value.values()))
    return isinstance(value, kind) if isinstance(kind, type) else True  # a kind not read here: diffusers checks it


def describe(kind: Any) -> str:
    """``kind`` in words, as the message's "accepted" part says it."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arg) for arg in sorted(args, key=lambda arg: arg is NoneType))
    if origin is typing.Literal:
        return "one of " + ", ".join(override_text(arg) for arg in args)
    if kind in NAMES:
        return NAMES[kind]
    if kind in (tuple, list) or origin in (tuple, list, Sequence):
        if origin is tuple and args and args[-1] is not Ellipsis:
            same = len(set(args)) == 1 and args[0] in PLURALS
            return f"a list of {len(args)} {PLURALS[args[0]]}" if same else f"a list of {len(args)} values"
        return f"a list of {PLURALS[args[0]]}" if args and args[0] in PLURALS else "a list"
    if kind is dict or origin in (dict, Mapping):
        return "a dict"
    return f"a {getattr(kind, '__name__', kind)}"


def override_text(value: Any) -> str:
    """``value`` as one writes it in a Hydra override or YAML (``true``, ``null``, ``[0,1]``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if _is_list(value):
        return "[" + ",".join(override_text(item) for item in value) + "]"
    return str(value)


def plain(value: Any) -> Any:
    """``value`` with OmegaConf's lists and dicts as Python's, for the message (and repr) to show it as typed."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    return [plain(item) for item in value] if _is_list(value) else value
