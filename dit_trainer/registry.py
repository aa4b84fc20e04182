"""Name -> implementation lookups for the config's choices (data sources, rewards, VAE and text-encoder kinds,
objectives, samplers): the accepted names in every error come from the registry itself, so they cannot drift."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from dit_trainer.errors import ConfigError

T = TypeVar("T")


def lookup(registry: Mapping[str, T], key: str, name: str) -> T:
    """``registry[name]``; an unknown name is a ``ConfigError`` naming ``key`` and the accepted names."""
    if name not in registry:
        raise ConfigError(
            key, name, f"accepted values are {', '.join(registry)}", f"set e.g. `{key}={next(iter(registry))}`"
        )
    return registry[name]
