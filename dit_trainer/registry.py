"""Registries: the names a config choice accepts (``model.family``, ``data.source``, ``reward.weights``, ...), each
bound to the implementation it names, imported on first use.

The names are plain strings, known without importing torch or diffusers (torchtitan keeps its model names the same
way), so a config can be checked, and a wrong name answered with the accepted ones, in a fraction of a second. A
name of the form ``package.module:ATTRIBUTE`` that is not in the table imports that attribute: a family, data source
or reward of the user's own, in a module outside this package, with no file here edited.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Generic, TypeVar

from dit_trainer.errors import ConfigError

T = TypeVar("T")


def lookup(registry: Mapping[str, T], key: str, name: str) -> T:
    """``registry[name]``; an unknown name is a ``ConfigError`` naming ``key`` and the accepted names."""
    if name not in registry:
        raise ConfigError(
            key, name, f"accepted values are {', '.join(registry)}", f"set e.g. `{key}={next(iter(registry))}`"
        )
    return registry[name]


def is_import_path(name: str) -> bool:
    """``package.module:ATTRIBUTE``: a user's own entry, imported as written."""
    module, colon, attribute = name.partition(":")
    return bool(colon and module and attribute.isidentifier())


def import_object(path: str, key: str) -> object:
    """The attribute ``path`` (``package.module:ATTRIBUTE``) names; one that cannot be imported is a ``ConfigError``
    naming ``key``."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigError(
            key,
            path,
            f"the module `{module_name}` could not be imported ({error})",
            "check the module name, and that its folder is on PYTHONPATH (or the package is installed)",
        ) from error
    if not hasattr(module, attribute):
        raise ConfigError(key, path, f"the module `{module_name}` defines no `{attribute}`", "check the name")
    return getattr(module, attribute)


class Registry(Generic[T]):
    """``name -> "module:ATTRIBUTE"`` for the config key ``key``, resolved (and imported) on first use. ``kind``
    (``module:CLASS``, imported only to check a user's entry) is the class every entry is an instance of: a user's
    ``package.module:ATTRIBUTE`` that is something else (a bare reward function, a method's class) is refused with
    the config, not found in a traceback where the trainer first uses it."""

    def __init__(self, key: str, entries: Mapping[str, str], kind: str | None = None) -> None:
        self.key = key
        self.entries = dict(entries)
        self.kind = kind
        self._resolved: dict[str, T] = {}

    def __iter__(self):
        return iter(self.entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.entries or is_import_path(name))

    def check(self, name: str, key: str | None = None) -> None:
        """Refuse a name that is neither registered nor an import path, without importing anything."""
        if name not in self:
            key = key or self.key
            raise ConfigError(
                key,
                name,
                f"accepted values are {', '.join(self.entries)} (or `package.module:ATTRIBUTE` for one of your own)",
                f"set e.g. `{key}={next(iter(self.entries))}`",
            )

    def get(self, name: str, key: str | None = None) -> T:
        """The implementation ``name`` stands for, imported now if it was not yet."""
        self.check(name, key)
        if name not in self._resolved:
            found = import_object(self.entries.get(name, name), key or self.key)
            if name not in self.entries:
                self._check_kind(found, name, key or self.key)
            self._resolved[name] = found  # type: ignore[assignment]
        return self._resolved[name]

    def _check_kind(self, found: object, name: str, key: str) -> None:
        if self.kind is None:
            return
        expected = import_object(self.kind, key)
        if not isinstance(found, expected):  # type: ignore[arg-type]
            what = f"the class {found.__name__}" if isinstance(found, type) else f"a {type(found).__name__}"
            example = next(iter(self.entries.values()))
            raise ConfigError(
                key,
                name,
                f"it is {what}, and `{key}` takes an instance of `{self.kind.replace(':', '.')}`, which tells the "
                "trainer how to build and use it",
                f"point it at one, made in your module as the package's own are (e.g. `{example}`)",
            )
