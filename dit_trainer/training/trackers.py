"""Experiment trackers through accelerate: W&B, TensorBoard, or none. ``metrics.jsonl`` is written regardless.

Under differential privacy, metrics computed on the private batches (the loss above all) are not covered by the
guarantee. Trackers that send what they log elsewhere (W&B: online at once, offline when synced) then get only the
metrics that depend on the noised model, the settings or the clock, unless ``privacy.log_losses_to_trackers``.
TensorBoard writes event files into the run folder, beside ``metrics.jsonl``, which holds everything anyway: it
gets everything too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.tracking import GeneralTracker
from PIL import Image

from dit_trainer.config import LoggerConfig, PrivacyConfig

logger = get_logger(__name__)

LOCAL_TRACKERS = ("tensorboard",)  # write only into the run folder
# Under DP, what may leave the run folder: the schedule, the norm of the noised gradient the optimizer applied, the
# throughput, the privacy spent, and the monitors (they sample the trained model). Anything else, including metrics
# added later, is held back until listed here.
PRIVATE_SAFE_METRICS = ("train/lr", "train/grad_norm", "train/images_per_sec", "train/seconds_per_step",
                        "privacy/epsilon")  # fmt: skip
PRIVATE_SAFE_SECTIONS = ("reward/", "grpo/", "samples/", "monitor/")


def private_safe(key: str) -> bool:
    return key in PRIVATE_SAFE_METRICS or key.startswith(PRIVATE_SAFE_SECTIONS)


class PrivateSafeMetrics(GeneralTracker):
    """A tracker that passes on only ``private_safe`` metrics, and images (sample and reward grids, which only read
    the trained model), to the tracker it wraps."""

    requires_logging_directory = False

    def __init__(self, inner: GeneralTracker) -> None:
        super().__init__(_blank=True)
        self.inner = inner
        self.name = inner.name

    @property
    def tracker(self):
        return self.inner.tracker

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        safe = {key: value for key, value in values.items() if private_safe(key)}
        if safe:
            self.inner.log(safe, step=step, **kwargs)

    def log_images(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.inner.log_images(values, step=step, **kwargs)

    def finish(self) -> None:
        self.inner.finish()


def withhold_private_metrics(accelerator: Accelerator, privacy: PrivacyConfig) -> None:
    """Under DP (and unless the user opted in), wrap every tracker that is not local in ``PrivateSafeMetrics``
    and say so once."""
    if not privacy.enabled or privacy.log_losses_to_trackers:
        return
    remote = [tracker.name for tracker in accelerator.trackers if tracker.name not in LOCAL_TRACKERS]
    if not remote:
        return
    accelerator.trackers = [
        tracker if tracker.name in LOCAL_TRACKERS else PrivateSafeMetrics(tracker) for tracker in accelerator.trackers
    ]
    logger.warning(
        f"privacy.enabled: the loss and other metrics computed on the private batches, which the DP guarantee does "
        f"not cover, are not sent to {', '.join(remote)} (metrics.jsonl has them all). Set "
        "privacy.log_losses_to_trackers=true to send them anyway.",
        main_process_only=True,
    )


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
    """W&B runs live inside the run folder (``run_dir/wandb``), so offline runs can be synced later. ``config`` is
    the run's whole config as a dict: the trackers' hyperparameters, and its ``privacy`` says what they may get."""
    if tracker_name(cfg) is None:
        return
    init_kwargs = {}
    if cfg.name == "wandb":
        init_kwargs["wandb"] = {"dir": str(run_dir), "mode": cfg.mode, "name": cfg.run_name, "entity": cfg.entity}
    accelerator.init_trackers(cfg.project, config=flat_config(config), init_kwargs=init_kwargs)
    withhold_private_metrics(accelerator, PrivacyConfig(**config.get("privacy", {})))


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
