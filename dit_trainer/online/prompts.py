"""Which prompts each GRPO epoch rolls out.

GRPO learns only from groups whose rewards disagree: a prompt the model always gets right (or always wrong) costs a
full group of rollouts and yields an advantage of zero. ``spread`` sampling spends the rollouts where the signal is:
each prompt is drawn with probability proportional to its recent within-group reward std (an average over the
epochs that rolled it out), never below ``floor`` x the largest, so solved prompts are still revisited and a
regression on them is seen. Prompts not rolled out yet count as the most uncertain, whatever the rewards' scale.
``uniform`` draws a fresh permutation every epoch. The statistics are updated from every process's groups, so all
processes hold the same state, and it is checkpointed by prompt text: a resumed run draws exactly the prompts the
uninterrupted one would, and one resumed with another prompt list (`trainer.allow_config_change=true`) keeps what it
learnt about the prompts it kept.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

# A prompt not rolled out yet spreads as much as this, or as the largest spread seen when that is more: at least as
# much as any prompt seen, whatever the rewards' scale (rewards in [0, 1] spread at most 0.5; a sum of several, or a
# CLIP score, can spread far more).
UNSEEN = 1.0
logger = logging.getLogger(__name__)


class PromptSampler:
    def __init__(
        self, prompts: Sequence[str], per_epoch: int, mode: str, floor: float = 0.1, memory: float = 0.5
    ) -> None:
        self.prompts = list(prompts)
        count = self.count = len(self.prompts)
        self.per_epoch = per_epoch
        self.mode = mode
        self.floor = floor
        self.memory = memory  # weight of the old spread when a prompt is rolled out again
        self.spread = torch.full((count,), UNSEEN, dtype=torch.float64)
        self.seen = torch.zeros(count, dtype=torch.bool)

    def draw(self, generator: torch.Generator) -> list[int]:
        """``per_epoch`` prompt indices, without repetition as long as there are enough prompts."""
        rounds = math.ceil(self.per_epoch / self.count)
        device = generator.device
        if self.mode == "uniform":
            order = [torch.randperm(self.count, generator=generator, device=device) for _ in range(rounds)]
        else:
            weights = self.weights().float().to(device)
            order = [torch.multinomial(weights, self.count, generator=generator) for _ in range(rounds)]
        return torch.cat(order)[: self.per_epoch].tolist()

    def weights(self) -> torch.Tensor:
        """``spread`` sampling's weights: each prompt's spread over the largest, at least ``floor``; a prompt not
        rolled out yet has the largest (``UNSEEN``)."""
        largest_seen = self.spread[self.seen].max().item() if self.seen.any() else 0.0
        spread = torch.where(self.seen, self.spread, max(UNSEEN, largest_seen))
        top = spread.max()
        return (spread / top).clamp(min=self.floor) if top > 0 else torch.ones(self.count)

    def observe(self, prompt_indices: torch.Tensor, group_stds: torch.Tensor) -> None:
        """The within-group reward std of every group rolled out this epoch (all processes)."""
        for index, std in zip(prompt_indices.tolist(), group_stds.tolist()):
            old = self.spread[index].item()
            self.spread[index] = self.memory * old + (1 - self.memory) * std if self.seen[index] else std
            self.seen[index] = True

    def state_dict(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "spread": self.spread.tolist(), "seen": self.seen.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The statistics of every saved prompt that is still in the list (by text); prompts new to the list count
        as not rolled out yet. A checkpoint written before the state recorded its prompts is read by position when
        the count matches (a changed list of the same length then cannot be told apart)."""
        saved = state.get("prompts", self.prompts if len(state["spread"]) == self.count else [])
        if saved == self.prompts:
            self.spread = torch.tensor(state["spread"], dtype=torch.float64)
            self.seen = torch.tensor(state["seen"], dtype=torch.bool)
            return
        position = {prompt: index for index, prompt in enumerate(saved)}
        kept = [(index, position[prompt]) for index, prompt in enumerate(self.prompts) if prompt in position]
        for index, old in kept:
            self.spread[index], self.seen[index] = state["spread"][old], state["seen"][old]
        logger.warning(
            f"The prompt list changed since the checkpoint ({len(state['spread'])} prompts -> {self.count}): the "
            f"reward spread of the {len(kept)} kept is restored, the others count as not rolled out yet"
        )
