"""The command line of the scripts that work on a finished run (sample, evaluate, export).

They take ``key=value`` overrides onto a dataclass schema, like Hydra but without creating an output folder,
and a bare first argument names the run folder: ``scripts/evaluate.py outputs/RUN steps=50``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dit_trainer.config import ConfigError, register_configs
from dit_trainer.hub import ModelLoadError

T = TypeVar("T")


def parse_cli(schema: type[T], argv: list[str], positional: str = "run_dir") -> T:
    """``argv`` (``key=value`` items, the first may be a bare value for ``positional``) merged onto ``schema``."""
    if argv and "=" not in argv[0]:
        argv = [f"{positional}={argv[0]}", *argv[1:]]
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(argv)))


def run_cli(main: Callable[[T], str], schema: type[T], argv: list[str], usage: str) -> int:
    """Parse, run ``main`` and print what it returns; a bad value prints one paragraph and the usage (exit 2)."""
    register_configs()
    try:
        message = main(parse_cli(schema, argv))
    except (ConfigError, ModelLoadError, OmegaConfBaseException) as error:
        print(f"error: {error}\n\n{usage}", file=sys.stderr)
        return 2
    print(message)
    return 0
