"""``trainer.method=grpo``: reward fine-tuning on the policy's own rollouts (section ``grpo``); it reads no data
set, and each step of the loop is one epoch of ``grpo.passes`` x ``grpo.minibatches`` updates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_trainer.methods.base import Method

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

    from dit_trainer.components.build import Components
    from dit_trainer.config import TrainConfig
    from dit_trainer.training.step import StepParts, TrainingStep


class GRPOMethod(Method):
    name = "grpo"
    section = "grpo"
    reads_data = False
    scores_rewards = True
    card_tag = "grpo"

    def check(self, cfg: TrainConfig) -> None:
        from dit_trainer.grpo.checks import check_grpo

        check_grpo(cfg)

    def updates_per_step(self, cfg: TrainConfig) -> int:
        return cfg.grpo.passes * cfg.grpo.minibatches

    def images_per_step(self, cfg: TrainConfig) -> int:
        return cfg.grpo.prompts_per_epoch * cfg.grpo.group_size

    def describe_inputs(self, cfg: TrainConfig) -> str:
        return f"GRPO rollouts: {cfg.grpo.prompts_per_epoch} prompts x {cfg.grpo.group_size} images per process"

    def describe(self, cfg: TrainConfig) -> str:
        rewards = ", ".join(f"{name} x {weight:g}" for name, weight in cfg.reward.weights.items())
        return f"GRPO reward fine-tuning (rewards: {rewards})"

    def build_step(
        self,
        cfg: TrainConfig,
        loop: StepParts,
        parts: Components,
        frozen_dtype: torch.dtype,
        dataloader: DataLoader | None,
    ) -> TrainingStep:
        from dit_trainer.grpo.build import build_grpo_step

        return build_grpo_step(cfg, loop, parts, frozen_dtype)


GRPO = GRPOMethod()
