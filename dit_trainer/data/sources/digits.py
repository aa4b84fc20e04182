"""scikit-learn's handwritten digits (1,797 8x8 images, 10 classes, shipped inside the package: no download) as a
class-conditional data set for the CPU, and a classifier trained on the real digits that judges generated ones.

``write_digits_folder`` writes them as class sub-folders ``0`` ... ``9`` of PNGs (torchvision's ``ImageFolder``
layout, which ``data=imagefolder`` reads as class labels); ``DigitClassifier`` reads a generated image back at 8x8.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dit_trainer.errors import ConfigError

MAX_INK = 16.0  # the data set's pixel values run from 0 (paper) to 16 (ink)


def load_digits(key: str, value: object) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 8, 8) in [0, 16], labels (N,)); scikit-learn is an optional dependency (`pip install
    dit-trainer[digits]`), and without it the error names ``key`` (what asked for the digits) and ``value``."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as error:
        raise ConfigError(
            key,
            value,
            "the digits data set and its classifier come from scikit-learn, which is not installed",
            "install it: `pip install 'scikit-learn>=1.3'` (or the `digits` extra of dit-trainer)",
        ) from error
    digits = sklearn_digits()
    return digits.images, digits.target


def write_digits_folder(folder: Path, resolution: int = 16) -> Path:
    """Every digit as a ``resolution``-px grey PNG (white ink on black, upscaled bilinearly) in ``folder/<label>/``
    (a new folder). The digits are read first and written under a staging name that is renamed when complete, so a
    missing scikit-learn or a killed write leaves nothing at ``folder`` to block the next attempt (which removes
    the stale staging folder)."""
    images, labels = load_digits("out_dir", str(folder))
    staging = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    for index, (image, label) in enumerate(zip(images, labels)):
        pixels = Image.fromarray(np.uint8(np.round(image / MAX_INK * 255)), mode="L")
        target = staging / str(label)
        target.mkdir(parents=True, exist_ok=True)
        pixels.resize((resolution, resolution), Image.BILINEAR).convert("RGB").save(target / f"{index:04d}.png")
    staging.rename(folder)  # fails if `folder` appeared meanwhile: nothing is replaced
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
        images, labels = load_digits("reward.weights", "digit_accuracy")  # the reward it judges for
        from sklearn.linear_model import LogisticRegression

        self.model = LogisticRegression(max_iter=2000).fit(images.reshape(len(images), -1), labels)

    def predict(self, images: torch.Tensor) -> np.ndarray:
        return self.model.predict(to_digit_features(images))
