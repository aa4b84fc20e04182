"""Builds the noise schedule of a run: the schedule family (``OBJECTIVES``: DDPM's, flow matching's) that trains its
objective, over the configured scheduler or the family's fallback. (Transformer families are
``components/families/``.)"""

from __future__ import annotations

from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion import OBJECTIVES
from dit_trainer.diffusion.schedule import NoiseSchedule, TimestepDensity


def build_noise_schedule(cfg: DiffusionConfig) -> NoiseSchedule:
    """The schedule of ``cfg.objective``'s family, over the configured scheduler or the family's fallback."""
    family = OBJECTIVES.get(cfg.objective)
    density = TimestepDensity(cfg.timestep_sampling, cfg.logit_mean, cfg.logit_std, cfg.mode_scale)
    return family.from_config(cfg, density)
