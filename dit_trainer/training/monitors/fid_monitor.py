"""A periodic FID / KID monitor: samples of the EMA weights against the validation images' cached features."""

from __future__ import annotations

import time

from torch import nn

from dit_trainer.diffusion.sampler import SamplerSettings
from dit_trainer.rewards.fid import ReferenceSet, sample_distances
from dit_trainer.training.monitors.monitors import Monitor, MonitorContext, sampling_weights


class FIDMonitor(Monitor):
    """Logs fid/fid, fid/kid_mean, fid/images (the samples it used) and fid/seconds. The extractor and reference
    live on the main process only."""

    def __init__(
        self,
        context: MonitorContext,
        every_n_steps: int,
        extractor: nn.Module | None,
        reference: ReferenceSet | None,
        settings: SamplerSettings,
        num_images: int | None,
        seed: int,
        batch_size: int,
    ) -> None:
        super().__init__(context, every_n_steps)
        self.extractor = extractor
        self.reference = reference
        self.settings = settings
        self.num_images = num_images
        self.seed = seed
        self.batch_size = batch_size

    def run(self, dit: nn.Module, step: int) -> dict[str, float]:
        start = time.perf_counter()
        text_to_image = self.context.text_to_image
        with sampling_weights(self.context.accelerator, dit, self.context.ema) as model:
            scores = sample_distances(
                lambda prompts, seeds: text_to_image(model, prompts, seeds, self.settings, self.batch_size),
                self.reference,
                self.extractor,
                self.num_images,
                self.seed,
                self.batch_size,
                text_to_image.device,
            )
        seconds = time.perf_counter() - start
        return {
            "fid/fid": scores["fid"],
            "fid/kid_mean": scores["kid_mean"],
            "fid/images": scores["fid_images"],  # an FID of 64 samples is another number than one of 10,000
            "fid/seconds": seconds,
        }
