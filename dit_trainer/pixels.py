"""Images as they travel: the data loader hands over uint8 pixels (a quarter of float32's bytes through the worker
queues, pinned memory and the host-device copy), and they become the models' float in [-1, 1] only on the device."""

from __future__ import annotations

import torch


def to_model_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 pixels in [0, 255] -> float32 in [-1, 1], the range the VAE expects; call it after the move to the device,
    so the widening and the arithmetic run there. The arithmetic is the one the host used to do, so the values are
    bit-identical. Float images (procedural sources such as shapes, plugin sources) are already in [-1, 1] and pass
    unchanged."""
    return images.float() / 127.5 - 1.0 if images.dtype == torch.uint8 else images
