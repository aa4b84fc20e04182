"""Experiment trackers through accelerate: W&B, TensorBoard, or none. ``metrics.jsonl`` is written regardless."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from accelerate import Accelerator
from PIL import Image

from dit_trainer.config import LoggerConfig


def tracker_name(cfg: LoggerConfig) -> str | None:
    """What to pass as ``Accelerator(log_with=...)``."""
    if cfg.name == "wandb" and cfg.mode == "disabled":
        return None
    return None if cfg.name == "none" else cfg.name


def flat_config(config: dict, prefix: str = "") -> dict[str, int | float | str | bool]:
    """``{"trainer": {"lr": 1}}`` -> ``{"trainer.lr": 1}``, non-scalars as text: every tracker accepts this."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def start_trackers(accelerator: Accelerator, cfg: LoggerConfig, run_dir: Path, config: dict) -> None:
    """W&B runs live inside the run folder (``run_dir/wandb``), so offline runs can be synced later."""
    if tracker_name(cfg) is None:
        return
    config = flat_config(config)
    init_kwargs = {}
    if cfg.name == "wandb":
        init_kwargs["wandb"] = {"dir": str(run_dir), "mode": cfg.mode, "name": cfg.run_name, "entity": cfg.entity}
    accelerator.init_trackers(cfg.project, config=config, init_kwargs=init_kwargs)


def log_image(accelerator: Accelerator, cfg: LoggerConfig, key: str, image: Image.Image, step: int) -> None:
    """Send one image (a sample grid) to the configured tracker, on the main process."""
    name = tracker_name(cfg)
    if name is None or not accelerator.is_main_process:
        return
    tracker = accelerator.get_tracker(name)
    if name == "wandb":
        tracker.log_images({key: [image]}, step=step)
    else:
        tracker.log_images({key: np.asarray(image)[None]}, step=step, dataformats="NHWC")
