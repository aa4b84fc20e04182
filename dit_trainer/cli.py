"""The command lines of the scripts.

Those that work on a finished run (sample, evaluate, export) take ``key=value`` overrides onto a dataclass schema,
like Hydra but without creating an output folder, and a bare first argument names the run folder:
``scripts/evaluate.py outputs/RUN steps=50``. Those that take train.py's own overrides (verify_gradients,
precompute, benchmark) compose the training config with Hydra's compose API, again without an output folder.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dit_trainer.config import ConfigError, TrainConfig, register_configs, to_train_config
from dit_trainer.hub import ModelLoadError

# What a bad command line, config value or model path raises: the scripts print it as one paragraph, exit 2.
INPUT_ERRORS = (ConfigError, ModelLoadError, HydraException, OmegaConfBaseException)

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
    except INPUT_ERRORS as error:
        print(f"error: {error}\n\n{usage}", file=sys.stderr)
        return 2
    print(message)
    return 0


def compose_train_config(config_dir: Path, overrides: list[str]) -> TrainConfig:
    """The validated config ``train.py`` would build from ``overrides``."""
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=overrides))


def run_train_script(config_dir: Path, overrides: list[str], main: Callable[[TrainConfig], tuple[str, int]]) -> int:
    """Compose ``overrides`` as ``train.py`` would, run ``main`` on the config and print its message; returns its
    exit code, or 2 with one paragraph for a bad value."""
    try:
        message, code = main(compose_train_config(config_dir, overrides))
    except INPUT_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(message)
    return code
