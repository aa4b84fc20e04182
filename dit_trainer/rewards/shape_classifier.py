"""``shapes_classifier``: the shapes recipes' gold judge, a small CNN shipped in ``assets/shape_classifier``.

The recipes train on ``shapes_alignment`` (template matching), so judging them with the same templates cannot show a
model that learned to please the templates rather than draw the shape. This judge reads the same verdicts (colour,
shape) by another route: a CNN trained by ``scripts/train_shape_classifier.py`` on renders degraded as a DiT degrades
them (blur, noise, resampling, JPEG, colour shifts), with a ``nothing`` class for images that show no shape.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from dit_trainer.components.freeze import freeze
from dit_trainer.errors import ConfigError
from dit_trainer.rewards.base import Reward, check_reward_inputs

ASSET = Path(__file__).resolve().parents[1] / "assets" / "shape_classifier"
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
NOTHING = "nothing"  # the shape class of an image that shows no shape


class ShapeClassifierNet(nn.Module):
    """Conv stages (3x3 conv, ReLU, 2x2 max-pool) then global average and max pooling, and two linear heads: colour
    logits and shape logits (the shapes plus ``nothing``). Global pooling makes it indifferent to where the shape is,
    as the data set's random positions require. Input: (B, 3, H, W) in [0, 1]."""

    def __init__(self, channels: Sequence[int], colors: int, shapes: int) -> None:
        super().__init__()
        stages, width = [], 3
        for out in channels:
            stages += [nn.Conv2d(width, out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            width = out
        self.features = nn.Sequential(*stages)
        self.color_head = nn.Linear(2 * width, colors)
        self.shape_head = nn.Linear(2 * width, shapes)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.features(images * 2 - 1)
        pooled = torch.cat([features.mean(dim=(2, 3)), features.amax(dim=(2, 3))], dim=1)
        return self.color_head(pooled), self.shape_head(pooled)


class ShapeClassifier:
    """The shipped network, frozen, with its class names: ``read`` turns images into (colour, shape) names."""

    def __init__(self, folder: Path = ASSET, device: torch.device | str = "cpu") -> None:
        if not (folder / WEIGHTS_NAME).is_file() or not (folder / CONFIG_NAME).is_file():
            raise ConfigError(
                "reward.weights",
                "shapes_classifier",
                f"the classifier it judges with is missing from {folder} ({WEIGHTS_NAME} and {CONFIG_NAME})",
                f"reinstall dit-trainer, or train it: `python scripts/train_shape_classifier.py --out {folder}`",
            )
        self.config = json.loads((folder / CONFIG_NAME).read_text())
        self.colors: list[str] = self.config["colors"]
        self.shapes: list[str] = self.config["shapes"]
        self.net = ShapeClassifierNet(self.config["channels"], len(self.colors), len(self.shapes))
        self.net.load_state_dict(load_file(folder / WEIGHTS_NAME))
        freeze(self.net).to(device)
        self.device = torch.device(device)

    @torch.no_grad()
    def probabilities(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(colour (B, colours), shape (B, shapes + 1)) probabilities; float32 whatever the run's precision, so the
        verdicts of a bf16 run and an fp32 run are the same judge's."""
        color_logits, shape_logits = self.net(images.to(self.device, torch.float32).clamp(0, 1))
        return color_logits.softmax(-1), shape_logits.softmax(-1)

    def read(self, images: torch.Tensor) -> list[tuple[str, str]]:
        """(colour, shape) seen in each image of a (B, 3, H, W) batch in [0, 1]; the shape may be ``nothing``."""
        colors, shapes = self.probabilities(images)
        return [
            (self.colors[c], self.shapes[s]) for c, s in zip(colors.argmax(-1).tolist(), shapes.argmax(-1).tolist())
        ]


def verdicts(seen: list[tuple[str, str]], captions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(colour correct, shape correct) per image, float (B,), as ``data.sources.shapes.alignment_components``
    returns them. No colour counts as seen in an image that shows no shape."""
    expected = [caption.removeprefix("a ").split(" ", 1) for caption in captions]
    color_ok = [shape != NOTHING and color == want[0] for (color, shape), want in zip(seen, expected)]
    shape_ok = [shape == want[-1] for (_, shape), want in zip(seen, expected)]
    return torch.tensor(color_ok, dtype=torch.float32), torch.tensor(shape_ok, dtype=torch.float32)


class ShapesClassifierReward:
    """Range [0, 1]: 0.5 when the classifier reads the captioned colour plus 0.5 when it reads the captioned shape.
    The same 0/1 verdicts as ``shapes_alignment`` (not probabilities), so the two judges' colour and shape
    accuracies compare number for number. A gap between them says: look at the images, the training judge may be
    gamed; off the data set's distribution (hollow outlines, textures) neither judge is ground truth."""

    name = "shapes_classifier"

    def __init__(self, classifier: ShapeClassifier) -> None:
        self.classifier = classifier

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_reward_inputs(images, prompts)
        color_ok, shape_ok = verdicts(self.classifier.read(images), prompts)
        return ((color_ok + shape_ok) / 2).to(images.device)


SHAPES_CLASSIFIER = Reward(lambda cfg, device, dtype: ShapesClassifierReward(ShapeClassifier(device=device)))
