"""The ``grpo`` section's own checks, after those every online method shares (``online.checks``): a window of
trained steps inside the sampler that each trajectory's draw fits in, and a stochastic step the objective has."""

from __future__ import annotations

from dit_trainer.config import DiffusionConfig, GRPOConfig
from dit_trainer.errors import ConfigError, require
from dit_trainer.grpo.window import window_plan


def check_grpo(diffusion: DiffusionConfig, grpo: GRPOConfig) -> None:
    g = grpo
    if g.sde_window == "fixed":
        check_fixed_window(g)
    else:
        check_moving_window(g)
    window_size = window_plan(g).size
    require(
        g.steps_per_trajectory is None or g.steps_per_trajectory <= window_size,
        "grpo.steps_per_trajectory",
        g.steps_per_trajectory,
        f"a trajectory has only {window_size} trained steps (the `grpo.sde_start`/`sde_steps` window) to draw from",
        f"set `grpo.steps_per_trajectory={window_size}` or lower, or null for all of them",
    )
    require(
        g.sde_type == "sde" or diffusion.objective == "flow_matching",
        "grpo.sde_type",
        g.sde_type,
        f"the coefficients-preserving sampler is a flow-matching step, and this model's objective is "
        f"`{diffusion.objective}` (its stochastic step is DDIM with eta = `grpo.noise_level`)",
        "set `grpo.sde_type=sde` (the only step an epsilon or v-prediction model has)",
    )
    check_noise_level(diffusion, g)


def check_noise_level(diffusion: DiffusionConfig, g: GRPOConfig) -> None:
    """DDIM's eta and the coefficients-preserving step's a are at most 1: above, the step asks for more noise than
    it may add (DDIM: 1 - a' - sigma_t^2 turns negative; CPS: sin(a pi / 2) falls again, then below 0), so the
    rollouts are NaN or the log-probabilities are, and every group's rewards tie: the run would train nothing."""
    flow_sde = diffusion.objective == "flow_matching" and g.sde_type == "sde"  # Flow-GRPO's SDE takes any a > 0
    if g.noise_level is None or g.noise_level <= 1 or flow_sde:
        return
    step = (
        "the coefficients-preserving step's noise std is sigma' sin(a pi / 2), which is at most sigma' at a = 1"
        if diffusion.objective == "flow_matching"
        else f"an `{diffusion.objective}` model's stochastic step is DDIM with eta = `grpo.noise_level`, and above 1 "
        "it asks for more noise than the step holds (1 - a' - sigma_t^2 turns negative: NaN images)"
    )
    raise ConfigError(
        "grpo.noise_level",
        g.noise_level,
        f"{step}, so no rollout would carry a usable log-probability and the run would train nothing",
        "set `grpo.noise_level` to a value in (0, 1], or null for the default",
    )


def check_fixed_window(g: GRPOConfig) -> None:
    """A window inside the sampler, and no setting of a moving one (it would be ignored: a forgotten
    ``grpo.sde_window``)."""
    settings = (("grpo.window_range", g.window_range, None), ("grpo.slide_every", g.slide_every, 1))
    moving = [(key, value) for key, value, default in settings if value != default]
    if moving:
        key, value = moving[0]
        raise ConfigError(
            key,
            value,
            "it places a moving window, and `grpo.sde_window=fixed` keeps the window at `grpo.sde_start`",
            f"set `grpo.sde_window=random` (Flow-GRPO-Fast) or `grpo.sde_window=sliding` (MixGRPO), or remove `{key}`",
        )
    window_end = g.sde_start + (g.sde_steps or 1)
    require(
        window_end < g.sample_steps,
        "grpo.sde_start/sde_steps",
        (g.sde_start, g.sde_steps),
        f"the trained steps must lie within the first {g.sample_steps - 1} of the `grpo.sample_steps="
        f"{g.sample_steps}` sampler steps (the last step is deterministic)",
        "lower `grpo.sde_start` or `grpo.sde_steps`, or raise `grpo.sample_steps`",
    )


def check_moving_window(g: GRPOConfig) -> None:
    """A window that moves needs its size, a range at least that wide, and a range the sampler has."""
    require(
        g.sde_steps is not None,
        "grpo.sde_steps",
        g.sde_steps,
        f"a `grpo.sde_window={g.sde_window}` window moves within its range and needs a size",
        "set `grpo.sde_steps` to the window's size, e.g. `grpo.sde_steps=2`",
    )
    plan = window_plan(g)
    require(
        plan.size <= plan.span,
        "grpo.sde_steps",
        g.sde_steps,
        f"the window does not fit its range of {plan.span} steps (`grpo.window_range={g.window_range}`; null is "
        f"half of `grpo.sample_steps={g.sample_steps}`)",
        f"set `grpo.sde_steps={plan.span}` or lower, or raise `grpo.window_range`",
    )
    require(
        plan.start + plan.span < g.sample_steps,
        "grpo.window_range",
        g.window_range,
        f"the range from `grpo.sde_start={g.sde_start}` ({plan.span} steps) must lie within the first "
        f"{g.sample_steps - 1} of the `grpo.sample_steps={g.sample_steps}` sampler steps (the last step is "
        "deterministic)",
        f"set `grpo.window_range={g.sample_steps - 1 - g.sde_start}` or lower, or lower `grpo.sde_start`",
    )
