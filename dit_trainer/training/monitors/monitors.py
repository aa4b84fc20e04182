"""Monitors: periodic work on the EMA weights that watches training and never changes it.

Every monitor runs under ``torch.no_grad()`` on the main process only (the other ranks wait at a barrier), with
the global RNG state forked, so the training that follows is bit-identical to training without the monitor. Under
FSDP a forward needs every process (each holds a slice of the weights): there every process samples the same
images, and only the main one writes and scores them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from diffusers.training_utils import EMAModel
from torch import nn

from dit_trainer.components.freeze import trainable_parameters
from dit_trainer.diffusion.sampler import SamplerSettings, TextToImage
from dit_trainer.images import ANIMATION_FPS, clip_grids, image_grid, save_animation
from dit_trainer.rewards.base import WeightedReward
from dit_trainer.rewards.groups import reward_metrics
from dit_trainer.sharding import reshard
from dit_trainer.training.monitors.tracker_media import MonitorImages, Trackers
from dit_trainer.training.state.saved_state import SavedState


@contextmanager
def sampling_weights(accelerator: Accelerator, dit: nn.Module, ema: EMAModel | None) -> Iterator[nn.Module]:
    """The unwrapped DiT with the EMA weights swapped in, in eval mode, under ``no_grad`` and autocast.

    The global RNG state is forked and the raw weights and mode are restored afterwards, so whatever runs inside
    leaves training exactly as it found it.
    """
    model = accelerator.unwrap_model(dit)
    reshard(model)  # FSDP: the sharded parameters are the ones the EMA swaps
    parameters = trainable_parameters(model.transformer)
    device = accelerator.device
    devices = [] if device.type == "cpu" else [device.index or 0]
    was_training = model.training
    with torch.random.fork_rng(devices=devices, device_type=device.type), torch.no_grad(), accelerator.autocast():
        if ema is not None:
            ema.store(parameters)
            ema.copy_to(parameters)
        model.eval()
        try:
            yield model
        finally:
            model.train(was_training)
            reshard(model)
            if ema is not None:
                ema.restore(parameters)


@dataclass(frozen=True)
class MonitorVerdict:
    """What a monitor asks of the run after it ran: keep this step's checkpoint from pruning under the name
    ``keep`` (``checkpoint=<keep>`` then reads it), and/or stop the run after this step's checkpoint because of
    ``stop``. Decided on the main process; the loop hands it to every process."""

    keep: str | None = None
    stop: str | None = None
    failed: str | None = None  # the error the monitor raised instead: the run checkpoints its step, then stops


class MonitorFailed(RuntimeError):
    """A monitor raised (a reward model out of memory, a user's monitor with a bug): the run stops after its step's
    checkpoint, the monitors of that step pending (they run first when it resumes)."""


@dataclass
class MonitorContext:
    """What every monitor of a run shares: where it runs, how it turns prompts into images, where it logs."""

    accelerator: Accelerator
    text_to_image: TextToImage
    ema: EMAModel | None
    trackers: Trackers
    sharded: bool = False  # FSDP: monitors run on every process


@dataclass(frozen=True)
class SamplingPlan:
    """What a monitor samples: ``group_size`` images per prompt, image ``j`` of every prompt with seed ``seed + j``,
    so images compare across prompts, steps and runs."""

    prompts: list[str]
    group_size: int
    seed: int
    settings: SamplerSettings
    batch_size: int = 32

    @property
    def image_prompts(self) -> list[str]:
        return [prompt for prompt in self.prompts for _ in range(self.group_size)]

    @property
    def image_seeds(self) -> list[int]:
        return [self.seed + j for _ in self.prompts for j in range(self.group_size)]


class Monitor:
    """Runs ``run`` on the main process every ``every_n_steps`` (and at the last step); others wait at a barrier
    (under FSDP they run it too, and write nothing).

    ``__call__`` returns the metrics to log at that step (empty on other ranks). An error ``run`` raises is kept in
    ``failure`` rather than raised, so that the ranks waiting at the barrier are not left there: the trainer hands it
    to every process, and they checkpoint together before stopping with it.
    """

    def __init__(self, context: MonitorContext, every_n_steps: int) -> None:
        self.context = context
        self.every_n_steps = every_n_steps
        self.failure: Exception | None = None

    def __call__(self, dit: nn.Module, step: int) -> dict[str, float]:
        accelerator = self.context.accelerator
        metrics, self.failure = {}, None
        if accelerator.is_main_process or self.context.sharded:
            try:
                metrics = self.run(dit, step)
            except Exception as error:  # sampling_weights has restored the weights and the RNG state
                self.failure = error
        accelerator.wait_for_everyone()
        return metrics if accelerator.is_main_process else {}

    def run(self, dit: nn.Module, step: int) -> dict[str, float]:
        raise NotImplementedError

    def verdict(self) -> MonitorVerdict:
        """What the last ``run`` asks of the run (on the main process); most monitors only watch."""
        return MonitorVerdict()

    def saved_states(self) -> dict[str, SavedState]:
        """What a monitor that remembers earlier runs (a best value so far) saves in checkpoints, by name."""
        return {}


class SamplingMonitor(Monitor):
    """A monitor that samples its ``plan`` with the EMA weights and writes grids into ``out_dir``."""

    def __init__(self, context: MonitorContext, plan: SamplingPlan, out_dir: Path, every_n_steps: int) -> None:
        super().__init__(context, every_n_steps)
        self.plan = plan
        self.out_dir = out_dir

    def _sample(self, dit: nn.Module) -> torch.Tensor:
        """The plan's images with the EMA weights: (prompts x group_size, 3, H, W) in [0, 1]."""
        plan = self.plan
        with sampling_weights(self.context.accelerator, dit, self.context.ema) as model:
            return self.context.text_to_image(
                model, plan.image_prompts, plan.image_seeds, plan.settings, plan.batch_size
            )

    def _save_grid(self, images: torch.Tensor, key: str, step: int, rewards: list[float] | None = None) -> Path:
        """``out_dir/step_<N>.png`` (clips: an animated ``.gif``), one row per prompt (each image labelled with its
        reward, if any), also sent to the tracker as ``key``, image by image with its prompt and seed (by the main
        process: under FSDP the others sampled the same images)."""
        clips = images.ndim == 5
        path = self.out_dir / f"step_{step:07d}.{'gif' if clips else 'png'}"
        if not self.context.accelerator.is_main_process:
            return path
        labels = {
            "labels": None if rewards is None else [f"{value:.2f}" for value in rewards],
            "row_labels": self.plan.prompts,
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if clips:  # an animated grid; trackers get it whole (W&B) or its middle frame (TensorBoard)
            frames = clip_grids(images, self.plan.group_size, **labels)
            save_animation(frames, path, ANIMATION_FPS)
            grid = frames[len(frames) // 2]
        else:
            grid = image_grid(images, self.plan.group_size, **labels)
            grid.save(path)
        prompts, seeds = self.plan.image_prompts, self.plan.image_seeds
        logged = MonitorImages(key, grid, images, prompts, seeds, rewards, path if clips else None)
        self.context.trackers.log_images(logged, step)
        return path


class SampleGridMonitor(SamplingMonitor):
    """Writes ``samples/step_<N>.png``: one row per prompt, one column per seed, sampled with the EMA weights."""

    def run(self, dit: nn.Module, step: int) -> dict[str, float]:
        start = time.perf_counter()
        self._save_grid(self._sample(dit), "samples", step)
        return {"samples/seconds": time.perf_counter() - start}


class GRPORewardMonitor(SamplingMonitor):
    """Rewards of ``group_size`` images per prompt and GRPO's group statistics, the way GRPO fine-tuning sees them.

    Writes ``rewards/step_<N>.png`` (one row per prompt, each image captioned with its reward).
    """

    def __init__(
        self,
        context: MonitorContext,
        plan: SamplingPlan,
        out_dir: Path,
        every_n_steps: int,
        reward: WeightedReward | None,
        eps: float,
    ) -> None:
        super().__init__(context, plan, out_dir, every_n_steps)
        self.reward = reward  # None on processes other than the main one: they never score
        self.eps = eps

    def run(self, dit: nn.Module, step: int) -> dict[str, float]:
        start = time.perf_counter()
        images = self._sample(dit)
        if self.reward is None:  # under FSDP, a process that only helped to sample
            return {}
        prompts = self.plan.image_prompts
        scores = self.reward.scores(images, prompts)
        rewards = self.reward.combine(scores).float().cpu()
        self._save_grid(images, "rewards", step, rewards.tolist())
        metrics = reward_metrics(scores, rewards, self.plan.group_size, self.eps)
        return metrics | {"monitor/seconds": time.perf_counter() - start}
