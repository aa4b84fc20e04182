"""What a run folder, a checkpoint or a cache records of a config, read back: plain values only (an interpolation in a
saved config is refused, never resolved), relative paths made absolute, and the paths of shipped models read from this
install when the one that recorded them has moved."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dit_trainer.config.resolvers import PACKAGE_DIR
from dit_trainer.errors import ConfigError

logger = logging.getLogger(__name__)

INSTALL_FOLDERS = ("site-packages", "dist-packages")  # where a pip install puts a package's folder


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


# Settings that name a local model folder when one exists at that path (else a hub id): recorded absolute, so that a
# run resumes, samples and exports from any working directory. So are prompt files (every key ending in
# PROMPT_FILE, in any section: the methods', the monitor's). (Data paths stay as given: a stream's draws are seeded
# by its shard paths.)
LOCAL_PATH_KEYS = (("model", "pretrained"), ("vae", "pretrained"), ("conditioner", "pretrained"))
PROMPT_FILE = "prompt_file"


def with_absolute_paths(tree: dict[str, Any], keys: tuple[tuple[str, str], ...] = LOCAL_PATH_KEYS) -> dict[str, Any]:
    """A plain config tree whose ``keys`` (section, key) and prompt files that are relative paths of existing files
    or folders (from the working directory) are made absolute. Applied to new configs and, for the comparisons of a
    resume or a cache, to what was recorded before they were made absolute (then read from the same working
    directory)."""
    tree = {name: _with_absolute_prompt_files(values) for name, values in tree.items()}
    for section, key in keys:
        values = tree.get(section)
        if isinstance(values, dict) and (local := _existing_relative(values.get(key))) is not None:
            tree[section] = {**values, key: str(local.absolute())}
    return tree


def _with_absolute_prompt_files(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    return {
        key: str(local.absolute())
        if key.endswith(PROMPT_FILE) and (local := _existing_relative(value)) is not None
        else _with_absolute_prompt_files(value)
        for key, value in node.items()
    }


def _existing_relative(value: Any) -> Path | None:
    """``value`` as a path when it is a relative one that exists from here."""
    if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
        return None
    local = Path(value).expanduser()
    return local if local.exists() else None


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


def report_relocated(moved: dict[str, str], config_path: Path) -> None:
    """Say which recorded paths are read elsewhere: a moved install's from this one (``config.resolvers.relocated``),
    a moved run folder's own starting weights from where the folder is now."""
    if moved and os.environ.get("RANK", "0") == "0":
        listed = ", ".join(f"{old} -> {new}" for old, new in moved.items())
        logger.warning(
            f"{config_path} names files that are no longer where it recorded them (a dit-trainer or package install, "
            f"or the run folder, was moved since); reading the copies here: {listed}"
        )


def first_interpolation(node: Any, key: str = "") -> tuple[str, str] | None:
    """The dotted key and text of the first ``${...}`` in a plain (unresolved) config tree, or None."""
    if isinstance(node, dict):
        children = ((f"{key}.{name}" if key else str(name), child) for name, child in node.items())
    elif isinstance(node, list):
        children = ((f"{key}[{index}]", child) for index, child in enumerate(node))
    else:
        return (key, node) if isinstance(node, str) and "${" in node else None
    for child_key, child in children:
        found = first_interpolation(child, child_key)
        if found is not None:
            return found
    return None


def refuse_interpolations(saved: DictConfig, config_path: Path) -> None:
    """Refuse a run config holding an interpolation, before anything resolves it.

    ``train.py`` writes ``config.yaml`` with every interpolation resolved, so one in it was added by hand or by
    another tool, and resolving it is not safe: ``${oc.env:NAME}`` reads an environment variable (a token, a
    password) into the config, and a resolver such as ``${package_model:MODULE}`` imports a module, running its
    code. Refusing is clearer than keeping the text literally, which would only fail later as a strange model path
    or prompt.
    """
    found = first_interpolation(OmegaConf.to_container(saved, resolve=False))
    if found is not None:
        key, text = found
        raise ConfigError(
            key,
            text,
            f"{config_path} must hold plain values (train.py writes it with every interpolation resolved), and "
            "resolving one from a run folder could read environment variables or import code",
            f"replace the interpolation in {config_path} with the value it stands for, then run again",
        )
