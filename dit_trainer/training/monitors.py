"""Periodic sample grids: fixed prompts and seeds, EMA weights, ``no_grad``, main process only."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from accelerate import Accelerator
from diffusers.training_utils import EMAModel
from PIL import Image
from torch import nn

from dit_trainer.config import LoggerConfig
from dit_trainer.diffusion.sampler import generate
from dit_trainer.diffusion.schedule import NoiseSchedule
from dit_trainer.training.trackers import log_image


def image_grid(images: torch.Tensor, columns: int, min_tile: int = 64) -> Image.Image:
    """(N, 3, H, W) in [0, 1] -> one PIL grid; tiny images are upscaled (nearest) so they stay visible."""
    count, _, height, width = images.shape
    scale = max(1, math.ceil(min_tile / max(height, width)))
    rows = math.ceil(count / columns)
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    grid = Image.new("RGB", (columns * width * scale, rows * height * scale), "white")
    for index, image in enumerate(pixels):
        tile = Image.fromarray(image.permute(1, 2, 0).numpy()).resize((width * scale, height * scale), Image.NEAREST)
        grid.paste(tile, ((index % columns) * width * scale, (index // columns) * height * scale))
    return grid


class SampleGridMonitor:
    """Writes ``samples/step_<N>.png``: one row per prompt, one column per seed, sampled with the EMA weights."""

    def __init__(
        self,
        accelerator: Accelerator,
        vae,
        text_encoder,
        schedule: NoiseSchedule,
        latent_shape: tuple[int, int, int],
        prompts: list[str],
        seeds: list[int],
        num_steps: int,
        guidance_scale: float,
        out_dir: Path,
        logger: LoggerConfig,
        ema: EMAModel | None,
    ) -> None:
        self.accelerator = accelerator
        self.vae = vae
        self.text_encoder = text_encoder
        self.schedule = schedule
        self.latent_shape = latent_shape
        self.prompts = prompts
        self.seeds = seeds
        self.num_steps = num_steps
        self.guidance_scale = guidance_scale
        self.out_dir = out_dir
        self.logger = logger
        self.ema = ema

    @torch.no_grad()
    def __call__(self, dit: nn.Module, step: int) -> Path | None:
        path = None
        if self.accelerator.is_main_process:
            model = self.accelerator.unwrap_model(dit)
            parameters = list(model.transformer.parameters())
            if self.ema is not None:
                self.ema.store(parameters)
                self.ema.copy_to(parameters)
            model.eval()
            try:
                with self.accelerator.autocast():
                    latents = generate(
                        model,
                        self.schedule,
                        self.text_encoder,
                        [p for p in self.prompts for _ in self.seeds],
                        [s for _ in self.prompts for s in self.seeds],
                        self.latent_shape,
                        self.num_steps,
                        self.guidance_scale,
                        self.accelerator.device,
                    )
                images = (self.vae.decode(latents) + 1) / 2
            finally:
                model.train()
                if self.ema is not None:
                    self.ema.restore(parameters)
            grid = image_grid(images, columns=len(self.seeds))
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = self.out_dir / f"step_{step:07d}.png"
            grid.save(path)
            log_image(self.accelerator, self.logger, "samples", grid, step)
        self.accelerator.wait_for_everyone()
        return path
