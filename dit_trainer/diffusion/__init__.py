"""Noise schedules by family, the per-sample loss, and the sampler: the math of diffusion in one place."""

from dit_trainer.diffusion.ddpm import DDPMSchedule, FallbackScheduler
from dit_trainer.diffusion.families import OBJECTIVES, SAMPLERS, build_noise_schedule
from dit_trainer.diffusion.flow import FallbackFlowScheduler, FlowSchedule
from dit_trainer.diffusion.loss import per_sample_mse
from dit_trainer.diffusion.sampler import SamplerSettings, TextToImage, generate
from dit_trainer.diffusion.schedule import NoiseSchedule, TimestepDensity

__all__ = [
    "OBJECTIVES",
    "SAMPLERS",
    "DDPMSchedule",
    "FallbackFlowScheduler",
    "FallbackScheduler",
    "FlowSchedule",
    "NoiseSchedule",
    "SamplerSettings",
    "TextToImage",
    "TimestepDensity",
    "build_noise_schedule",
    "generate",
    "per_sample_mse",
]
