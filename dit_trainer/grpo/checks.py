"""The ``grpo`` section's checks: those every online method shares (``online.checks``), then a window of trained
steps inside the sampler that each trajectory's draw fits in."""

from __future__ import annotations

from dit_trainer.config import TrainConfig
from dit_trainer.errors import require
from dit_trainer.online.checks import check_online


def check_grpo(cfg: TrainConfig) -> None:
    g = cfg.grpo
    check_online(cfg, "grpo", g)
    window_end = g.sde_start + (g.sde_steps or 1)
    require(
        window_end < g.sample_steps,
        "grpo.sde_start/sde_steps",
        (g.sde_start, g.sde_steps),
        f"the trained steps must lie within the first {g.sample_steps - 1} of the `grpo.sample_steps="
        f"{g.sample_steps}` sampler steps (the last step is deterministic)",
        "lower `grpo.sde_start` or `grpo.sde_steps`, or raise `grpo.sample_steps`",
    )
    window_size = g.sde_steps or g.sample_steps - 1 - g.sde_start
    require(
        g.steps_per_trajectory is None or g.steps_per_trajectory <= window_size,
        "grpo.steps_per_trajectory",
        g.steps_per_trajectory,
        f"a trajectory has only {window_size} trained steps (the `grpo.sde_start`/`sde_steps` window) to draw from",
        f"set `grpo.steps_per_trajectory={window_size}` or lower, or null for all of them",
    )
