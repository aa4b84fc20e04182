"""Image preprocessing shared by the file-based data sources."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


def to_model_input(image: Image.Image, resolution: int, center_crop: bool = True) -> torch.Tensor:
    """Any PIL image -> (3, resolution, resolution) float in [-1, 1].

    Grayscale, palette and RGBA images become RGB (alpha composited on white). The short side is resized to
    ``resolution`` and the centre cropped; without ``center_crop`` the whole image is squashed to a square.
    """
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    image = image.convert("RGB")
    if center_crop:
        scale = resolution / min(image.size)
        width, height = (max(resolution, round(side * scale)) for side in image.size)
        image = image.resize((width, height), Image.BICUBIC)
        left, top = (width - resolution) // 2, (height - resolution) // 2
        image = image.crop((left, top, left + resolution, top + resolution))
    else:
        image = image.resize((resolution, resolution), Image.BICUBIC)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)
    return pixels.float() / 127.5 - 1.0
