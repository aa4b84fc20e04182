"""Loading pretrained models by hub id or local path, with an error that says what to do when it fails."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from huggingface_hub import hf_hub_download, snapshot_download, try_to_load_from_cache
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from safetensors import SafetensorError

from dit_trainer.errors import ModelLoadError

T = TypeVar("T")


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def looks_like_a_path(name_or_path: str) -> bool:
    """A hub id is ``name`` or ``owner/name`` and starts with neither ``.`` nor ``~``: anything else names a folder."""
    return name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1 or "\\" in name_or_path


def _error(name_or_path: str, config_key: str, reason: str) -> ModelLoadError:
    path, reason = Path(name_or_path).expanduser().absolute(), reason.rstrip(".")
    if path.is_dir() or looks_like_a_path(name_or_path):  # a folder: downloading it by that name cannot help
        if not path.is_dir():
            reason = "it is a file, not a model's folder" if path.is_file() else f"there is no folder at {path}"
        return ModelLoadError(
            f"Could not load `{config_key}={name_or_path}` (a local path): {reason}. Set `{config_key}` to the "
            "folder that holds the model (what its `save_pretrained` wrote, or a snapshot from `huggingface-cli "
            "download ID --local-dir DIR`), or to the model's hub id."
        )
    return ModelLoadError(
        f"Could not load `{config_key}={name_or_path}` (a hub id or local path)"
        f"{' with HF_HUB_OFFLINE=1' if hub_offline() else ''}: {reason}. If the machine has no hub access, download "
        f"the model elsewhere (e.g. `huggingface-cli download {name_or_path} --local-dir DIR`), copy it here, and set "
        f"`{config_key}=DIR`; otherwise check the id and your network or HF token."
    )


# What reading a folder's weights raises when a file is missing or unreadable (diffusers wraps safetensors' error in
# an OSError). Weights that read but do not fit the model are another error, not caught as this one.
UNREADABLE_WEIGHTS = (OSError, SafetensorError)


def unreadable_weights(folder: Path, error: BaseException) -> ModelLoadError:
    """The one paragraph for weights in a folder of ours (a checkpoint's) that cannot be read."""
    while error.__cause__ is not None or error.__context__ is not None:  # the reader's own words, not a wrapper's
        error = error.__cause__ or error.__context__
    damaged = isinstance(error, SafetensorError | UnicodeDecodeError)  # a header cut short or overwritten
    return ModelLoadError(
        f"Could not read the weights in {folder} ({type(error).__name__}: {' '.join(str(error).split())[:300]})"
        + (": they are damaged or were cut short (a copy that did not finish, a failing disk)" if damaged else "")
        + f". To fix it, use an older checkpoint of the run (for sample, evaluate and export `checkpoint=checkpoint-N`,"
        f" one of the folders beside {folder.parent.name}; `latest` passes over only checkpoints whose files are "
        "missing or of another size than their manifest.json lists), or copy this one again from where it was "
        "written."
    )


def load_pretrained(load: Callable[..., T], name_or_path: str, config_key: str, **kwargs) -> T:
    """``load(name_or_path, **kwargs)`` (a ``from_pretrained``), turning hub/file errors into ``ModelLoadError``."""
    try:
        return load(name_or_path, **kwargs)
    except (OSError, ValueError) as error:  # huggingface_hub's errors derive from OSError or ValueError
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        folder = Path(name_or_path).expanduser()
        if folder.is_dir():  # the loader's own words take a folder it cannot read for a hub id
            reason = _what_the_folder_lacks(folder, kwargs.get("subfolder") or "", config_key) or reason
        raise _error(name_or_path, config_key, reason) from error


# A pipeline folder's part that each config section loads (diffusers' model_index.json names them).
PIPELINE_PARTS = {"model": "transformer", "vae": "vae", "conditioner": "text_encoder"}


def _what_the_folder_lacks(folder: Path, subfolder: str, config_key: str) -> str | None:
    """Why a local ``folder`` (at ``subfolder``) holds no model to load, where it can be told: a pipeline's root,
    whose parts live in sub-folders; a sub-folder that is not there; an empty folder. None: another reason."""
    section = config_key.split(".")[0]
    part = PIPELINE_PARTS.get(section)
    if not subfolder and (folder / "model_index.json").is_file() and part and (folder / part).is_dir():
        return (
            f"it is a diffusers pipeline's folder (it holds model_index.json), whose parts are in sub-folders: set "
            f"`{section}.subfolder={part}`"
        )
    at = folder / subfolder
    if not at.is_dir():
        return f"it has no sub-folder `{subfolder}` (`{section}.subfolder`)"
    if not any(at.iterdir()):
        return f"{at} is empty (no config.json, no weights)"
    return None


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


def pretrained_config(name_or_path: str | None, subfolder: str | None, revision: str | None) -> dict | None:
    """The ``config.json`` of a model on this machine (a local folder, or a hub id in the hub cache), read without
    loading the model, so that config validation can use it; None when it is not here yet (it downloads on load)."""
    folder = model_folder(name_or_path, subfolder, revision) if name_or_path else None
    try:
        return None if folder is None else json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not there, or not JSON
        return None


def model_config(name_or_path: str, subfolder: str | None, revision: str | None, config_key: str) -> dict:
    """The ``config.json`` of a model, downloaded alone (not the weights) when it is not on this machine yet;
    failures are a ``ModelLoadError`` naming ``config_key``."""
    config = pretrained_config(name_or_path, subfolder, revision)
    if config is not None:
        return config
    path = load_pretrained(hf_hub_download, name_or_path, config_key, filename="config.json", subfolder=subfolder,
                           revision=revision)  # fmt: skip
    return json.loads(Path(path).read_text(encoding="utf-8"))


WEIGHTS_NAME = "diffusion_pytorch_model"  # diffusers' model weights: .safetensors, sharded with an index, or .bin
PROBES, PROBE_BYTES = 64, 1 << 16


def model_folder(name_or_path: str, subfolder: str | None, revision: str | None) -> Path | None:
    """The folder of a model on this machine (a local folder, or a hub id's snapshot in the hub cache), found by its
    config.json; None when it is not here."""
    filename = f"{subfolder}/config.json" if subfolder else "config.json"
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return local / subfolder if subfolder else local
    try:
        path = try_to_load_from_cache(name_or_path, filename, revision=revision)
    except (OSError, ValueError):  # not a valid hub id (HFValidationError)
        return None
    return Path(path).parent if isinstance(path, (str, Path)) else None


def weights_fingerprint(name_or_path: str, subfolder: str | None, revision: str | None) -> str | None:
    """A digest of the weight files diffusers loads for a model on this machine: each file's name and size, and
    64 probes of 64 KiB spread over it (fine-tuned weights of one architecture share names and sizes, and differ
    almost everywhere). It tells a LoRA checkpoint's base replaced under the same path, or an unpinned hub id moved
    on, from the base it trained on, in milliseconds. None when the model is not here."""
    folder = model_folder(name_or_path, subfolder, revision)
    if folder is None:
        return None
    index = folder / f"{WEIGHTS_NAME}.safetensors.index.json"
    try:
        if index.is_file():
            files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        else:
            files = [next(name for name in (f"{WEIGHTS_NAME}.safetensors", f"{WEIGHTS_NAME}.bin")
                          if (folder / name).is_file())]  # fmt: skip
        digest = hashlib.sha256()
        for name in files:
            size = (folder / name).stat().st_size
            digest.update(f"{name}:{size}".encode())
            with (folder / name).open("rb") as file:
                for probe in range(PROBES):
                    file.seek(probe * max(0, size - PROBE_BYTES) // (PROBES - 1))
                    digest.update(file.read(PROBE_BYTES))
    except (OSError, ValueError, KeyError, StopIteration):  # no weights, an unreadable index: it fails to load
        return None
    return digest.hexdigest()[:16]
