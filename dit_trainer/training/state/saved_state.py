"""State a checkpoint keeps beside the weights for whoever owns it (the DP accountant, a method's prompt statistics
or its copy of the weights): any object with ``state_dict`` and ``load_state_dict``, written once by the main
process as JSON, or as safetensors when it holds tensors (never a pickle: loading one can run code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file


class SavedState(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def write_saved_state(folder: Path, name: str, state: dict[str, Any]) -> None:
    """``state`` as ``<name>.safetensors`` when it holds tensors (a method's copy of weights), else ``<name>.json``."""
    if state and all(isinstance(value, torch.Tensor) for value in state.values()):
        save_file(
            {key: value.detach().contiguous().cpu() for key, value in state.items()}, folder / f"{name}.safetensors"
        )
    else:
        (folder / f"{name}.json").write_text(json.dumps(state), encoding="utf-8")


def read_saved_state(folder: Path, name: str) -> dict[str, Any] | None:
    """What ``write_saved_state`` wrote (tensors on the CPU), or None when the checkpoint has no such state."""
    if (folder / f"{name}.safetensors").is_file():
        return load_file(folder / f"{name}.safetensors")
    if (folder / f"{name}.json").is_file():
        return json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
    return None
