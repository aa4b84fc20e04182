"""``jpeg_compressibility``: simpler images (fewer JPEG bits) score higher, the classic DDPO/flow_grpo reward."""

from __future__ import annotations

import io
from collections.abc import Sequence

import torch
from PIL import Image

from dit_trainer.rewards.base import Reward, check_reward_inputs


class JPEGCompressibilityReward:
    """Range (-inf, 0]: minus the bits per pixel of the image saved as a JPEG at ``quality``.

    Per pixel rather than per file so the scale does not change with the resolution. It ignores the prompt.
    """

    name = "jpeg_compressibility"

    def __init__(self, quality: int = 95) -> None:
        self.quality = quality

    def _bits_per_pixel(self, pixels) -> float:
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=self.quality)
        return 8 * buffer.tell() / (pixels.shape[0] * pixels.shape[1])

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_reward_inputs(images, prompts)
        pixels = (images.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        return -torch.tensor([self._bits_per_pixel(image) for image in pixels], device=images.device)


JPEG_COMPRESSIBILITY = Reward(lambda cfg, device, dtype: JPEGCompressibilityReward(cfg.jpeg_quality))
