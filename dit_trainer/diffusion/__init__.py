"""Noise schedules, objectives, the per-sample loss, and the sampler: the math of diffusion in one place."""

from dit_trainer.diffusion.loss import per_sample_mse
from dit_trainer.diffusion.sampler import SamplerSettings, TextToImage, generate
from dit_trainer.diffusion.schedule import FallbackScheduler, NoiseSchedule, build_noise_schedule

__all__ = [
    "FallbackScheduler",
    "NoiseSchedule",
    "SamplerSettings",
    "TextToImage",
    "build_noise_schedule",
    "generate",
    "per_sample_mse",
]
