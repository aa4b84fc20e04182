"""The ``diffusion`` section's checks: the objective names a schedule family, which checks its own settings; the
sampler is one the family offers; the step counts and betas are consistent."""

from __future__ import annotations

from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion import OBJECTIVES, SAMPLERS
from dit_trainer.errors import require
from dit_trainer.hub import require_offline_copy


def check_sampler(objective: str, sampler: str, key: str = "diffusion.sampler") -> None:
    """``sampler`` (set at ``key``) samples the process ``objective`` trains: another would sample a different one."""
    SAMPLERS.check(sampler, key)  # a name no family offers is told apart from one this family does not
    samplers = OBJECTIVES.get(objective).samplers
    require(
        sampler in samplers,
        key,
        sampler,
        f"`diffusion.objective={objective}` samples with {' or '.join(f'`{name}`' for name in samplers)}",
        f"set `{key}={next(iter(samplers))}`",
    )


def check_diffusion(diffusion: DiffusionConfig) -> None:
    d = diffusion
    OBJECTIVES.get(d.objective).check_config(d)
    check_sampler(d.objective, d.sampler)
    require(
        d.sample_steps <= d.num_train_timesteps,
        "diffusion.sample_steps",
        d.sample_steps,
        f"it must be between 1 and diffusion.num_train_timesteps ({d.num_train_timesteps})",
    )
    require(
        0 < d.beta_start < d.beta_end < 1,
        "diffusion.beta_start/beta_end",
        (d.beta_start, d.beta_end),
        "they must satisfy 0 < beta_start < beta_end < 1",
    )
    if d.scheduler_pretrained:
        require_offline_copy(d.scheduler_pretrained, "diffusion.scheduler_pretrained")
