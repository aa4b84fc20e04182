"""What a run sends its tracker beyond metrics: the monitors' images and the trained weights, and a line saying where
it all goes (for the start banner).

W&B gets each prompt's images as one captioned media panel (``samples/00 a red circle``: one image per seed, its
reward in the caption), so a prompt can be followed across steps with the step slider, and a ``wandb.Table`` of every
image at every step (step, prompt, seed, image, reward) to filter and scrub; the final weights (the EMA ones when
saved) become a version of the model artifact ``model-<run id>`` and, with ``logger.log_checkpoints``, so does every
checkpoint's. TensorBoard gets the grids the run folder holds. A video run's clips go to W&B as its animated grid
(``samples/video``, a ``wandb.Video``) and to TensorBoard as the grid of their middle frames (its videos need moviepy).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from PIL import Image

from dit_trainer.config import LoggerConfig
from dit_trainer.images import to_pil
from dit_trainer.runs.run_folder import WeightsLayout
from dit_trainer.training.monitors.trackers import tracker_name, wandb_mode

PANEL_TITLE = 48  # characters of a prompt in a W&B panel's key


@dataclass(frozen=True)
class MonitorImages:
    """One monitor's images at one step: ``images`` (N, 3, H, W) in [0, 1] with the ``prompt`` and ``seed`` of each
    (and its reward, for the reward monitor), and the ``grid`` the run folder keeps. Clips (N, 3, F, H, W) come with
    their animated grid's file (``animation``) and the middle frame's grid as ``grid``."""

    key: str  # samples | rewards
    grid: Image.Image
    images: torch.Tensor
    prompts: list[str]
    seeds: list[int]
    rewards: list[float] | None = None
    animation: Path | None = None


def panel_key(key: str, index: int, prompt: str) -> str:
    """``samples/00 a red circle``: the prompt's number keeps the panels in prompt order and two long prompts apart;
    characters W&B reads as structure (``/``, ``.``) are replaced."""
    title = re.sub(r"[^\w ,'!?()-]+", "_", prompt).strip()[:PANEL_TITLE]
    return f"{key}/{index:02d} {title}"


class Trackers:
    """The run's tracker (from ``LoggerConfig``), for the monitors' images and the checkpoints' weights; all on the
    main process (elsewhere every call does nothing)."""

    def __init__(self, accelerator: Accelerator, cfg: LoggerConfig, layout: WeightsLayout) -> None:
        self.accelerator = accelerator
        self.cfg = cfg
        self.layout = layout
        self.name = tracker_name(cfg) if accelerator.is_main_process else None

    def log_images(self, logged: MonitorImages, step: int) -> None:
        if self.name == "wandb" and logged.animation is not None:
            import wandb

            run = self.accelerator.get_tracker("wandb", unwrap=True)
            run.log({f"{logged.key}/video": wandb.Video(str(logged.animation), format="gif")}, step=step)
        elif self.name == "wandb":
            self._wandb_images(logged, step)
        elif self.name == "tensorboard":
            tracker = self.accelerator.get_tracker("tensorboard")
            tracker.log_images({logged.key: np.asarray(logged.grid)[None]}, step=step, dataformats="NHWC")

    def _wandb_images(self, logged: MonitorImages, step: int) -> None:
        """Per prompt, a list of captioned images; and the step's rows of the monitor's table. Sent to the W&B run
        itself: images only read the trained model, so they pass the DP filter of ``trackers.PrivateSafeMetrics``."""
        import wandb

        run = self.accelerator.get_tracker("wandb", unwrap=True)
        columns = ["step", "prompt", "seed", "image", *(["reward"] if logged.rewards is not None else [])]
        table, panels = wandb.Table(columns=columns), {}
        for index, (image, prompt, seed) in enumerate(zip(logged.images, logged.prompts, logged.seeds)):
            reward = None if logged.rewards is None else logged.rewards[index]
            caption = f"seed {seed}" + ("" if reward is None else f", reward {reward:.2f}")
            pil = to_pil(image)
            panels.setdefault(prompt, []).append(wandb.Image(pil, caption=caption))
            table.add_data(step, prompt, seed, wandb.Image(pil, caption=caption), *([] if reward is None else [reward]))
        values = {panel_key(logged.key, index, prompt): images for index, (prompt, images) in enumerate(panels.items())}
        run.log({**values, f"{logged.key}/table": table}, step=step)

    def log_checkpoint(self, checkpoint: Path, step: int, final: bool) -> None:
        """W&B: the checkpoint's weights (the EMA ones when saved) as a version of ``model-<run id>``, aliased
        ``step-<N>`` (and ``final``): the final weights with ``logger.log_model``, every checkpoint's with
        ``logger.log_checkpoints``."""
        if self.name != "wandb" or not (final and self.cfg.log_model or self.cfg.log_checkpoints):
            return
        import wandb

        run = self.accelerator.get_tracker("wandb", unwrap=True)
        weights = self.layout.weights_dir(checkpoint, ema=True)
        metadata = {"step": step, "weights": weights.name, "lora": self.layout.lora, "checkpoint": str(checkpoint)}
        artifact = wandb.Artifact(f"model-{run.id}", type="model", metadata=metadata)
        artifact.add_dir(str(weights))
        run.log_artifact(artifact, aliases=[f"step-{step}", *(["final"] if final else [])])

    def describe(self, run_dir: Path) -> str:
        """Where the metrics go, for the start banner."""
        where = f"{run_dir / 'metrics.jsonl'}, loss lines in train.log"
        if self.cfg.name == "tensorboard":
            return f"{where}; TensorBoard: `tensorboard --logdir {run_dir / 'logs'}`"
        if self.cfg.name != "wandb":
            return where
        mode = wandb_mode(self.cfg)
        if mode == "disabled" or self.name is None:
            return f"{where}; W&B disabled"
        run = self.accelerator.get_tracker("wandb", unwrap=True)
        if mode == "offline" or not getattr(run, "url", None):
            return f"{where}; W&B offline in {run_dir / 'wandb'} (upload: `wandb sync {run_dir}/wandb/offline-run-*`)"
        return f"{where}; W&B: {run.url}"
