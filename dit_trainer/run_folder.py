"""A run folder: what ``train.py`` writes there and how other tools find it again.

Layout: ``config.yaml`` (the resolved config), ``metrics.jsonl``, ``checkpoints/checkpoint-N/`` (each complete one
with a ``manifest.json`` listing its files and sizes, the trained weights in one of the ``WeightsFormat`` layouts),
``samples/`` and ``rewards/``. The run folder is also checked before Hydra creates it: an unwritable or impossible
path (a full or read-only disk, a file where a folder should be) becomes one paragraph naming ``hydra.run.dir``
instead of a traceback from Hydra.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffusers import ModelMixin
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dit_trainer.components.dit import load_trained_transformer
from dit_trainer.components.lora import load_adapter, save_adapter
from dit_trainer.config import TrainConfig, to_train_config
from dit_trainer.errors import ConfigError, exit_code
from dit_trainer.run_lock import RunFolderLock

CONFIG = "config.yaml"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PATTERN = re.compile(r"checkpoint-(\d+)$")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class WeightsFormat:
    """Where and how a checkpoint keeps the trained weights: the raw ones in ``directory``, the EMA ones in
    ``ema_directory``."""

    directory: str
    ema_directory: str
    lora: bool

    def save(self, transformer: ModelMixin, path: Path) -> None:
        if self.lora:
            save_adapter(transformer, path)
        else:
            transformer.save_pretrained(path)

    def load(self, transformer: ModelMixin, path: Path) -> None:
        if self.lora:
            load_adapter(transformer, path)
        else:
            transformer.load_state_dict(load_trained_transformer(path, type(transformer)).state_dict())

    def weights_dir(self, checkpoint: Path, ema: bool) -> Path:
        """The EMA weights if asked for and saved, else the raw ones."""
        return checkpoint / (
            self.ema_directory if ema and (checkpoint / self.ema_directory).is_dir() else self.directory
        )


FULL_WEIGHTS = WeightsFormat("transformer", "transformer_ema", lora=False)
LORA_WEIGHTS = WeightsFormat("transformer_lora", "transformer_lora_ema", lora=True)


def weights_format(lora: bool) -> WeightsFormat:
    return LORA_WEIGHTS if lora else FULL_WEIGHTS


def is_checkpoint(path: Path) -> bool:
    return any((path / fmt.directory).is_dir() for fmt in (FULL_WEIGHTS, LORA_WEIGHTS))


def checkpoint_step(path: Path) -> int:
    match = CHECKPOINT_PATTERN.search(path.name)
    if match is None:
        raise ValueError(f"{path} is not named checkpoint-<step>")
    return int(match.group(1))


def incomplete_reason(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint (None when it is): no manifest, or a listed file missing or of
    another size than written."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return f"it has no {MANIFEST} (its write did not finish)"
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError):
        return f"its {MANIFEST} is unreadable"
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes where {size} were written (truncated or replaced)"
    return None


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    if not checkpoints_dir.is_dir():
        return []
    found = [p for p in checkpoints_dir.iterdir() if p.is_dir() and CHECKPOINT_PATTERN.search(p.name)]
    return sorted((p for p in found if incomplete_reason(p) is None), key=checkpoint_step)


def resolve_checkpoint(spec: str | None, checkpoints_dir: Path) -> Path | None:
    """``latest`` -> the newest complete checkpoint in ``checkpoints_dir`` (None if there is none); a path -> that
    folder, refused unless it is a complete checkpoint (``trainer.resume``: training continues from all of it)."""
    if spec is None:
        return None
    if spec == "latest":
        found = list_checkpoints(checkpoints_dir)
        return found[-1] if found else None
    path = Path(spec).expanduser()
    reason = incomplete_reason(path) if is_checkpoint(path) else None
    if not is_checkpoint(path) or reason:
        raise ConfigError(
            "trainer.resume",
            spec,
            f"it is not a complete checkpoint folder ({reason})"
            if reason
            else "it is not a checkpoint folder (one with a `transformer/` or `transformer_lora/` inside)",
            f"use `trainer.resume=latest` (the newest complete checkpoint) or a folder such as "
            f"{checkpoints_dir}/checkpoint-1000",
        )
    return path


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


def read_run_config(run_dir: Path) -> TrainConfig:
    """The validated config a run folder was trained with; interpolations in it are refused, never resolved."""
    config_path = run_dir / CONFIG
    if not config_path.is_file():
        raise ConfigError(
            "run_dir",
            str(run_dir),
            f"it holds no {CONFIG}, so it is not a dit-trainer run folder",
            "pass the folder train.py wrote (its hydra.run.dir)",
        )
    saved = OmegaConf.load(config_path)
    refuse_interpolations(saved, config_path)
    try:
        return to_train_config(saved)
    except OmegaConfBaseException as error:  # a setting renamed, removed or retyped since the run was trained
        key, reason = error.full_key or CONFIG, str(error).partition("\n")[0]
        raise ConfigError(
            key,
            OmegaConf.select(saved, error.full_key, default=None) if error.full_key else None,
            f"this version of dit-trainer does not accept it in {config_path} ({reason}; "
            "the file was written by another version, or edited)",
            f"edit that key in {config_path} to the current setting (`python train.py --cfg job` prints them "
            "all) or remove it, then run again",
        ) from None


def check_writable_folder(path: Path, key: str) -> None:
    """``path`` is, or can be created as, a folder this process may write into (nothing is created here)."""
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        reason = f"{existing} is a file, so no folder can be made inside it"
    elif not os.access(existing, os.W_OK | os.X_OK):
        reason = f"this process may not write into {existing} (read-only disk or permissions)"
    else:
        return
    raise ConfigError(key, str(path), reason, f"point `{key}` at a writable folder, e.g. `{key}=/scratch/runs/NAME`")


class RunFolderCheck(Callback):
    """Hydra callback (``hydra.callbacks`` in ``configs/train.yaml``) that runs before Hydra makes the run folder
    and writes into it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Also refuses a folder another run is training in, before Hydra writes its files there (the main process
        only: the others would find the main process's lock)."""
        run_dir = Path(config.hydra.run.dir)
        try:
            check_writable_folder(run_dir, "hydra.run.dir")
            if os.environ.get("RANK", "0") == "0":
                with RunFolderLock(run_dir):
                    pass
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(exit_code(error))
