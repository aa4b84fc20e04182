"""The watch on reward hacking: a gold reward that is never trained on, read on held-out prompts.

A training reward can rise while what it stands for falls (a judge gamed with textured backgrounds, images
flattened for a compressibility score). Every ``gold_every`` epochs the watch samples its held-out prompts with the
EMA weights, as users sample, and scores the same images with the gold reward and with the training reward, so the
two are compared on one set of images. The best gold so far is kept: its checkpoint is kept from pruning
(``checkpoint=best_gold``). With a stop margin, the run stops when the gold reward has fallen that far below its
best while the training reward on the same images stands above its value at the best: the reward is being gamed,
and more training only moves further from what it stands for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from dit_trainer.rewards.base import WeightedReward
from dit_trainer.training.monitors.monitors import MonitorContext, MonitorVerdict, SamplingMonitor, SamplingPlan
from dit_trainer.training.state.saved_state import SavedState

BEST_GOLD = "best_gold"  # the name the best-gold checkpoint is kept under (``checkpoint=best_gold``)


@dataclass
class GoldRecord:
    """The best gold reward so far, the step it was read at and the training reward on the same images then."""

    gold: float
    step: int
    training: float


class GoldJudge:
    """Decides, from each reading, whether it is the best gold so far (keep its checkpoint) or whether the gold has
    fallen ``stop_margin`` below the best while the training reward rose past its value then (stop)."""

    def __init__(self, gold_name: str, stop_margin: float | None, margin_key: str) -> None:
        self.gold_name = gold_name
        self.stop_margin = stop_margin
        self.margin_key = margin_key  # the config key of the margin, named when the rule fires
        self.best: GoldRecord | None = None

    def judge(self, step: int, gold: float, training: float) -> MonitorVerdict:
        best = self.best
        if best is None or gold > best.gold:
            self.best = GoldRecord(gold, step, training)
            return MonitorVerdict(keep=BEST_GOLD)
        if self.stop_margin is None or gold > best.gold - self.stop_margin or training <= best.training:
            return MonitorVerdict()
        return MonitorVerdict(
            stop=f"the gold reward {self.gold_name} fell to {gold:.4f}, {best.gold - gold:.4f} below its best "
            f"{best.gold:.4f} at step {best.step} (`{self.margin_key}={self.stop_margin:g}`), while the training "
            f"reward on the same images rose from {best.training:.4f} to {training:.4f}: the training reward is "
            f"being gamed. The best-gold weights are kept in checkpoint-{best.step} (`checkpoint={BEST_GOLD}`)"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"best": None if self.best is None else vars(self.best)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = None if state["best"] is None else GoldRecord(**state["best"])


class GoldWatch(SamplingMonitor):
    """Samples ``plan`` (held-out prompts, fixed seeds) with the EMA weights, scores the images with ``gold`` and
    with ``training`` (None on processes other than the main one: they only help to sample under FSDP), writes
    ``gold/step_<N>.png`` and logs ``gold/<name>``, ``gold/training_reward``, ``gold/best`` and
    ``gold/best_step``."""

    def __init__(
        self,
        context: MonitorContext,
        plan: SamplingPlan,
        out_dir: Path,
        every_n_steps: int,
        rewards: tuple[WeightedReward, WeightedReward] | None,
        judge: GoldJudge,
    ) -> None:
        super().__init__(context, plan, out_dir, every_n_steps)
        self.rewards = rewards
        self.judge = judge
        self._verdict = MonitorVerdict()

    def run(self, dit: nn.Module, step: int) -> dict[str, float]:
        start = time.perf_counter()
        images = self._sample(dit)
        self._verdict = MonitorVerdict()
        if self.rewards is None:
            return {}
        gold_reward, training_reward = self.rewards
        prompts = self.plan.image_prompts
        gold = gold_reward(images, prompts).float().cpu()
        training = training_reward(images, prompts).float().mean().item()
        self._save_grid(images, "gold", step, gold.tolist())
        self._verdict = self.judge.judge(step, gold.mean().item(), training)
        best = self.judge.best
        return {
            f"gold/{self.judge.gold_name}": gold.mean().item(),
            "gold/training_reward": training,
            "gold/best": best.gold,
            "gold/best_step": best.step,
            "gold/seconds": time.perf_counter() - start,
        }

    def verdict(self) -> MonitorVerdict:
        return self._verdict

    def saved_states(self) -> dict[str, SavedState]:
        return {"gold_watch": self.judge}
