"""Loading pretrained models by hub id or local path, with an error that says what to do when it fails."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message names the id/path, the config key and the way out."""


def load_pretrained(load: Callable[..., T], name_or_path: str, config_key: str, **kwargs) -> T:
    """``load(name_or_path, **kwargs)`` (a ``from_pretrained``), turning hub/file errors into ``ModelLoadError``."""
    try:
        return load(name_or_path, **kwargs)
    except (OSError, ValueError) as error:  # huggingface_hub's errors derive from OSError or ValueError
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
        where = "a local folder" if os.path.isdir(os.path.expanduser(name_or_path)) else "a hub id or local path"
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelLoadError(
            f"Could not load `{config_key}={name_or_path}` ({where}){' with HF_HUB_OFFLINE=1' if offline else ''}: "
            f"{reason}. If the machine has no hub access, download the model elsewhere (e.g. "
            f"`huggingface-cli download {name_or_path} --local-dir DIR`), copy it here, and set `{config_key}=DIR`; "
            "otherwise check the id and your network or HF token."
        ) from error
