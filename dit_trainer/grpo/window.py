"""Where GRPO's window of noisy, trained steps sits in each epoch (``grpo.sde_window``).

- ``fixed``: the same steps every epoch, from ``sde_start``.
- ``random`` (Flow-GRPO-Fast): a start drawn each epoch from the run's checkpointed generator, so that the window lies
  within the ``window_range`` steps from ``sde_start``; a resumed run draws what the uninterrupted one did.
- ``sliding`` (MixGRPO's ``progressive`` strategy with ``roll_back``): from ``sde_start``, one step later every
  ``slide_every`` epochs, back to ``sde_start`` after the last position of the range.

A moving window keeps its epoch count and its current position in the checkpoint (``state_dict``): the sliding
position follows from the count, so a resumed run slides on from where it stopped. Under DDP every process slides
alike, while a random window is drawn by each process from its own generator (the checkpoint holds the main
process's last start; every process draws the next from its restored generator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dit_trainer.config.grpo import GRPOConfig


@dataclass(frozen=True)
class WindowPlan:
    """A ``grpo`` section's window, its defaults resolved: ``size`` steps within the ``span`` steps from ``start``
    (for ``fixed``, ``span`` is ``size``), over a sampler of ``num_steps``."""

    kind: str
    start: int
    size: int
    span: int
    slide_every: int
    num_steps: int

    @property
    def positions(self) -> int:
        """How many starts the window can take."""
        return self.span - self.size + 1

    def mask(self, start: int) -> torch.Tensor:
        """(K,) CPU bools: the window's steps when it starts at ``start``."""
        window = torch.zeros(self.num_steps, dtype=torch.bool)
        window[start : start + self.size] = True
        return window


def window_plan(g: GRPOConfig) -> WindowPlan:
    """The window of ``g``. A fixed one without ``sde_steps`` reaches to the last step but one (the last is always
    deterministic); a moving one lies within ``window_range`` steps (null: half the sampler's, Flow-GRPO-Fast's)."""
    if g.sde_window == "fixed":
        size = g.sample_steps - 1 - g.sde_start if g.sde_steps is None else g.sde_steps
        return WindowPlan("fixed", g.sde_start, size, size, 1, g.sample_steps)
    span = g.sample_steps // 2 if g.window_range is None else g.window_range
    return WindowPlan(g.sde_window, g.sde_start, g.sde_steps, span, g.slide_every, g.sample_steps)


class SDEWindow:
    """The window's position epoch after epoch (``place``), checkpointed as ``grpo_window`` when it moves."""

    def __init__(self, plan: WindowPlan) -> None:
        self.plan = plan
        self.epoch = 0  # windows placed so far
        self.start = plan.start

    @property
    def moves(self) -> bool:
        return self.plan.kind != "fixed"

    def place(self, generator: torch.Generator) -> torch.Tensor:
        """The (K,) CPU mask of the next epoch's window; ``random`` draws its start from ``generator``, the others
        draw nothing (a fixed window leaves the run's random stream as it always was)."""
        plan = self.plan
        if plan.kind == "random":
            offset = torch.randint(plan.positions, (1,), generator=generator, device=generator.device).item()
        elif plan.kind == "sliding":
            offset = self.epoch // plan.slide_every % plan.positions
        else:
            offset = 0
        self.start = plan.start + int(offset)
        self.epoch += 1
        return plan.mask(self.start)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "start": self.start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.start = int(state["epoch"]), int(state["start"])
