"""The run folder is checked before Hydra creates it: an unwritable or impossible path (a full or read-only disk, a
file where a folder should be) becomes one paragraph naming ``hydra.run.dir`` instead of a traceback from Hydra."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from dit_trainer.config import ConfigError


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
    """Hydra callback (``hydra.callbacks`` in ``configs/train.yaml``) that runs before the run folder is made."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_writable_folder(Path(config.hydra.run.dir), "hydra.run.dir")
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
