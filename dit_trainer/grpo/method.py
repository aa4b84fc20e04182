"""``trainer.method=grpo``: reward fine-tuning on the policy's own rollouts (section ``grpo``); it reads no data
set, and each step of the loop is one epoch of ``grpo.passes`` x ``grpo.minibatches`` updates."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dit_trainer.online.method import OnlineMethod

if TYPE_CHECKING:
    from dit_trainer.training.step import TrainingStep


class GRPOMethod(OnlineMethod):
    name = "grpo"
    section = "grpo"
    title = "GRPO"
    card_tag = "grpo"

    @property
    def check(self) -> Callable[..., None]:
        """``grpo.checks.check_grpo``, imported when asked: its module loads torch."""
        from dit_trainer.grpo.checks import check_grpo

        return check_grpo

    @property
    def build_step(self) -> Callable[..., TrainingStep]:
        """``grpo.build.build_grpo_step``."""
        from dit_trainer.grpo.build import build_grpo_step

        return build_grpo_step


GRPO = GRPOMethod()
