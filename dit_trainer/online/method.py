"""What the online methods answer alike: they read no data set, train on rewards, and each step of the loop is one
epoch of ``passes`` x ``minibatches`` updates on ``prompts_per_epoch`` x ``group_size`` images per process, all
settings of the method's own section (a ``RolloutConfig``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from dit_trainer.methods.base import Method
from dit_trainer.registry import import_object

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from dit_trainer.config import DiffusionConfig, RewardConfig
    from dit_trainer.config.online import RolloutConfig
    from dit_trainer.training.monitors.monitors import Monitor, MonitorContext
    from dit_trainer.training.step import TrainingStep


class OnlineMethod(Method):
    """A method that trains on its own rollouts; ``title`` is how the banner and the model card name it. Its
    answers read its own section (``section``) as ``rollouts``. Its own check and step builder are named by import
    path (``own_check``, ``step_builder``) and imported when asked: their modules load torch, and a method is named
    while a config is validated, before any model library loads."""

    reads_data = False
    scores_rewards = True
    title = ""
    own_check = ""  # `package.module:function`: the rules of the method's own section
    step_builder = ""  # `package.module:function`: its `build_step`

    def section_roles(self) -> dict[str, str]:
        return {"rollouts": str(self.section)}

    @property
    def check(self) -> Callable[..., None]:
        return import_object(self.own_check, "trainer.method")  # type: ignore[return-value]

    @property
    def build_step(self) -> Callable[..., TrainingStep]:
        return import_object(self.step_builder, "trainer.method")  # type: ignore[return-value]

    def checks(self) -> list[Callable[..., None]]:
        """The rules every online method shares (``online.checks``), then the method's own."""
        from dit_trainer.online.checks import check_online

        return [functools.partial(check_online, method=str(self.section)), self.check]

    def updates_per_step(self, rollouts: RolloutConfig) -> int:
        return rollouts.passes * rollouts.minibatches

    def images_per_step(self, rollouts: RolloutConfig) -> int:
        return rollouts.prompts_per_epoch * rollouts.group_size

    def describe_inputs(self, rollouts: RolloutConfig) -> str:
        return f"{self.title} rollouts: {rollouts.prompts_per_epoch} prompts x {rollouts.group_size} images per process"

    def build_monitors(
        self,
        rollouts: RolloutConfig,
        reward: RewardConfig,
        diffusion: DiffusionConfig,
        context: MonitorContext,
        run_dir: Path,
        step: TrainingStep,
        frozen_dtype: torch.dtype,
    ) -> list[Monitor]:
        """The gold-reward watch when the section names a gold reward; it compares the gold with the training
        reward (the step's ``feedback.reward``, every online step's) on the same images."""
        if not rollouts.gold_reward:
            return []
        from dit_trainer.online.build import build_gold_watch

        training_reward = step.feedback.reward  # type: ignore[attr-defined]
        return [
            build_gold_watch(rollouts, str(self.section), reward, diffusion, context, run_dir / "gold",
                             training_reward, frozen_dtype)
        ]  # fmt: skip

    def describe(self, reward: RewardConfig) -> str:
        rewards = ", ".join(f"{name} x {weight:g}" for name, weight in reward.weights.items())
        return f"{self.title} reward fine-tuning (rewards: {rewards})"
