"""Loading pretrained models by hub id or local path, with an error that says what to do when it fails."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

from dit_trainer.errors import ModelLoadError

T = TypeVar("T")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _error(name_or_path: str, config_key: str, reason: str) -> ModelLoadError:
    where = "a local folder" if Path(name_or_path).expanduser().is_dir() else "a hub id or local path"
    return ModelLoadError(
        f"Could not load `{config_key}={name_or_path}` ({where}){' with HF_HUB_OFFLINE=1' if hub_offline() else ''}: "
        f"{reason}. If the machine has no hub access, download the model elsewhere (e.g. "
        f"`huggingface-cli download {name_or_path} --local-dir DIR`), copy it here, and set `{config_key}=DIR`; "
        "otherwise check the id and your network or HF token."
    )


def load_pretrained(load: Callable[..., T], name_or_path: str, config_key: str, **kwargs) -> T:
    """``load(name_or_path, **kwargs)`` (a ``from_pretrained``), turning hub/file errors into ``ModelLoadError``."""
    try:
        return load(name_or_path, **kwargs)
    except (OSError, ValueError) as error:  # huggingface_hub's errors derive from OSError or ValueError
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise _error(name_or_path, config_key, reason) from error


def require_offline_copy(name_or_path: str, config_key: str) -> None:
    """With ``HF_HUB_OFFLINE=1``, fail at once unless ``name_or_path`` is a folder or a cached hub snapshot.

    Checked with the config, so an offline cluster job stops in seconds instead of after loading other models.
    """
    if not hub_offline() or Path(name_or_path).expanduser().is_dir():
        return
    try:
        snapshot_download(name_or_path, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError) as error:
        raise _error(name_or_path, config_key, "it is neither a local folder nor in the hub cache") from error
