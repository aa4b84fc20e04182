"""Judging a trained run: for the shapes data, colour and shape accuracy read from the pixels of its samples."""

from __future__ import annotations

from dit_trainer.data.shapes import CAPTIONS, alignment_components
from dit_trainer.inference import TrainedRun


def shapes_accuracy(
    run: TrainedRun,
    images_per_caption: int = 4,
    seed: int = 0,
    steps: int | None = None,
    guidance_scale: float | None = None,
) -> dict[str, float]:
    """Sample every shapes caption ``images_per_caption`` times (fixed seeds) and score what was drawn."""
    prompts = [caption for caption in CAPTIONS for _ in range(images_per_caption)]
    seeds = [seed + index for index in range(len(prompts))]
    images = run.generate_images(
        prompts,
        seeds,
        steps or run.cfg.diffusion.sample_steps,
        run.cfg.diffusion.guidance_scale if guidance_scale is None else guidance_scale,
    )
    color_ok, shape_ok = alignment_components(images, prompts)
    return {"color": color_ok.mean().item(), "shape": shape_ok.mean().item(), "images": len(prompts)}
