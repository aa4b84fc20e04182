"""scikit-learn's handwritten digits (1,797 8x8 images, 10 classes, shipped inside the package: no download) as a
class-conditional data set for the CPU, and a classifier trained on the real digits that judges generated ones.

``write_digits_folder`` writes them as class sub-folders ``0`` ... ``9`` of PNGs (torchvision's ``ImageFolder``
layout, which ``data=imagefolder`` reads as class labels); ``DigitClassifier`` reads a generated image back at 8x8.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dit_trainer.errors import ConfigError

MAX_INK = 16.0  # the data set's pixel values run from 0 (paper) to 16 (ink)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 8, 8) in [0, 16], labels (N,)); scikit-learn is an optional dependency (`pip install
    dit-trainer[digits]`)."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as error:
        raise ConfigError(
            "data.path",
            None,
            "the digits data set and its classifier come from scikit-learn, which is not installed",
            "install it: `pip install 'scikit-learn>=1.3'` (or the `digits` extra of dit-trainer)",
        ) from error
    digits = sklearn_digits()
    return digits.images, digits.target


def write_digits_folder(folder: Path, resolution: int = 16) -> Path:
    """Every digit as a ``resolution``-px grey PNG (white ink on black, upscaled bilinearly) in ``folder/<label>/``."""
    folder.mkdir(parents=True, exist_ok=False)
    images, labels = load_digits()
    for index, (image, label) in enumerate(zip(images, labels)):
        pixels = Image.fromarray(np.uint8(np.round(image / MAX_INK * 255)), mode="L")
        target = folder / str(label)
        target.mkdir(exist_ok=True)
        pixels.resize((resolution, resolution), Image.BILINEAR).convert("RGB").save(target / f"{index:04d}.png")
    return folder


def to_digit_features(images: torch.Tensor) -> np.ndarray:
    """(B, 3, H, W) images in [0, 1] -> (B, 64) features as the data set stores them: grey, area-averaged to 8x8,
    on the 0-16 scale."""
    grey = images.detach().float().mean(1, keepdim=True).cpu()
    small = torch.nn.functional.adaptive_avg_pool2d(grey, 8)
    return (small.flatten(1) * MAX_INK).numpy()


class DigitClassifier:
    """A logistic regression fitted on the real digits (about 97 % accurate on held-out real ones)."""

    def __init__(self) -> None:
        from sklearn.linear_model import LogisticRegression

        images, labels = load_digits()
        self.model = LogisticRegression(max_iter=2000).fit(images.reshape(len(images), -1), labels)

    def predict(self, images: torch.Tensor) -> np.ndarray:
        return self.model.predict(to_digit_features(images))
