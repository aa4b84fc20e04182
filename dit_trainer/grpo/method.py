"""``trainer.method=grpo``: reward fine-tuning on the policy's own rollouts (section ``grpo``); it reads no data
set, and each step of the loop is one epoch of ``grpo.passes`` x ``grpo.minibatches`` updates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_trainer.online.method import OnlineMethod

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

    from dit_trainer.components.build import Components
    from dit_trainer.config import TrainConfig
    from dit_trainer.training.step import StepParts, TrainingStep


class GRPOMethod(OnlineMethod):
    name = "grpo"
    section = "grpo"
    title = "GRPO"
    card_tag = "grpo"

    def check(self, cfg: TrainConfig) -> None:
        from dit_trainer.grpo.checks import check_grpo

        check_grpo(cfg)

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
