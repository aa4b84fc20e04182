"""``trainer.method=grpo``: reward fine-tuning on the policy's own rollouts (section ``grpo``); it reads no data
set, and each step of the loop is one epoch of ``grpo.passes`` x ``grpo.minibatches`` updates."""

from __future__ import annotations

from dit_trainer.online.method import OnlineMethod


class GRPOMethod(OnlineMethod):
    name = "grpo"
    section = "grpo"
    title = "GRPO"
    card_tag = "grpo"
    own_check = "dit_trainer.grpo.checks:check_grpo"
    step_builder = "dit_trainer.grpo.build:build_grpo_step"


GRPO = GRPOMethod()
