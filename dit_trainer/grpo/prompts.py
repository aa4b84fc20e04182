"""Which prompts each GRPO epoch rolls out.

GRPO learns only from groups whose rewards disagree: a prompt the model always gets right (or always wrong) costs a
full group of rollouts and yields an advantage of zero. ``spread`` sampling spends the rollouts where the signal is:
each prompt is drawn with probability proportional to its recent within-group reward std (an average over the
epochs that rolled it out), never below ``floor`` x the largest, so solved prompts are still revisited and a
regression on them is seen. Prompts not rolled out yet count as the most uncertain. ``uniform`` draws a fresh
permutation every epoch. The statistics are updated from every process's groups, so all processes hold the same
state, and it is checkpointed: a resumed run draws exactly the prompts the uninterrupted one would.
"""

from __future__ import annotations

import math
from typing import Any

import torch

UNSEEN = 1.0  # the weight of a prompt not rolled out yet: above any within-group std of rewards in [0, 1]


class PromptSampler:
    def __init__(self, count: int, per_epoch: int, mode: str, floor: float = 0.1, memory: float = 0.5) -> None:
        self.count = count
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
            top = self.spread.max()
            weights = (self.spread / top).clamp(min=self.floor) if top > 0 else torch.ones(self.count)
            weights = weights.float().to(device)
            order = [torch.multinomial(weights, self.count, generator=generator) for _ in range(rounds)]
        return torch.cat(order)[: self.per_epoch].tolist()

    def observe(self, prompt_indices: torch.Tensor, group_stds: torch.Tensor) -> None:
        """The within-group reward std of every group rolled out this epoch (all processes)."""
        for index, std in zip(prompt_indices.tolist(), group_stds.tolist()):
            old = self.spread[index].item()
            self.spread[index] = self.memory * old + (1 - self.memory) * std if self.seen[index] else std
            self.seen[index] = True

    def state_dict(self) -> dict[str, Any]:
        return {"spread": self.spread.tolist(), "seen": self.seen.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.spread = torch.tensor(state["spread"], dtype=torch.float64)
        self.seen = torch.tensor(state["seen"], dtype=torch.bool)
