"""Which schedule family trains each objective, and the samplers each family offers: the registries that
``diffusion.objective`` and ``diffusion.sampler`` are checked against."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_trainer.diffusion.ddpm import DDPMSchedule
from dit_trainer.diffusion.flow import FlowSchedule
from dit_trainer.diffusion.schedule import NoiseSchedule, TimestepDensity
from dit_trainer.registry import lookup

if TYPE_CHECKING:
    from dit_trainer.config import DiffusionConfig

OBJECTIVES: dict[str, type[DDPMSchedule | FlowSchedule]] = {
    "epsilon": DDPMSchedule,
    "v_prediction": DDPMSchedule,
    "flow_matching": FlowSchedule,
}
SAMPLERS = {name: family for family in dict.fromkeys(OBJECTIVES.values()) for name in family.samplers}


def build_noise_schedule(cfg: DiffusionConfig) -> NoiseSchedule:
    """The schedule of ``cfg.objective``'s family, over the configured scheduler or the family's fallback."""
    family = lookup(OBJECTIVES, "diffusion.objective", cfg.objective)
    density = TimestepDensity(cfg.timestep_sampling, cfg.logit_mean, cfg.logit_std, cfg.mode_scale)
    return family.from_config(cfg, density)
