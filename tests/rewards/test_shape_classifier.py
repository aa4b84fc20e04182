"""The shapes recipes' gold judge (``rewards/shape_classifier.py``): the shipped CNN reads fresh renders, clean and
degraded, as the data set drew them, scores true captions high and wrong ones low, and sees nothing on grey."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from dit_trainer.config import RewardConfig
from dit_trainer.data.sources.shapes import BACKGROUND, CAPTIONS, COLORS, SHAPES, ShapesDataset
from dit_trainer.errors import ConfigError
from dit_trainer.rewards.build import build_reward
from dit_trainer.rewards.shape_classifier import ASSET, NOTHING, ShapeClassifier, verdicts

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def classifier() -> ShapeClassifier:
    return ShapeClassifier()


@pytest.fixture(scope="module")
def fresh_renders() -> tuple[torch.Tensor, list[str]]:
    """480 renders on a seed no training or held-out set of the classifier used: 20 of each caption."""
    batch = next(iter(DataLoader(ShapesDataset(480, seed=20_260), batch_size=480)))
    return (batch["image"] + 1) / 2, list(batch["caption"])


def _accuracy(classifier: ShapeClassifier, images: torch.Tensor, captions: list[str]) -> tuple[float, float]:
    color_ok, shape_ok = verdicts(classifier.read(images), captions)
    return color_ok.mean().item(), shape_ok.mean().item()


def test_the_shipped_asset_is_small_and_names_the_data_sets_classes():
    config = json.loads((ASSET / "config.json").read_text())
    assert config["colors"] == list(COLORS) and config["shapes"] == [*SHAPES, NOTHING]
    assert (ASSET / "model.safetensors").stat().st_size < 1_000_000


def test_it_reads_fresh_clean_renders(classifier, fresh_renders):
    color, shape = _accuracy(classifier, *fresh_renders)
    assert color >= 0.97 and shape >= 0.97


def test_blurred_resampled_and_noisy_renders_still_read_right(classifier, fresh_renders):
    images, captions = fresh_renders
    blurred = F.avg_pool2d(F.pad(images, (1, 1, 1, 1), mode="replicate"), 3, stride=1)
    resampled = F.interpolate(F.interpolate(images, size=16, mode="area"), size=32, mode="bilinear")
    noisy = (images + 0.06 * torch.randn(images.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    for degraded in (blurred, resampled, noisy):
        color, shape = _accuracy(classifier, degraded, captions)
        assert color >= 0.97 and shape >= 0.97


def _mismatched(caption: str, color_step: int, shape_step: int) -> str:
    color, shape = caption.removeprefix("a ").split(" ")
    colors, shapes = list(COLORS), list(SHAPES)
    other_color = colors[(colors.index(color) + color_step) % len(colors)]
    return f"a {other_color} {shapes[(shapes.index(shape) + shape_step) % len(shapes)]}"


def test_the_reward_is_built_by_name_and_scores_captions_as_verdicts(fresh_renders):
    images, captions = fresh_renders
    reward = build_reward(RewardConfig(weights={"shapes_classifier": 1.0}), CPU)
    right = reward(images, captions)
    assert right.shape == (480,) and right.dtype == torch.float32
    assert set(right.unique().tolist()) <= {0.0, 0.5, 1.0} and right.mean() >= 0.97
    assert reward(images, [_mismatched(c, 1, 1) for c in captions]).mean() <= 0.03
    wrong_color = reward(images, [_mismatched(c, 3, 0) for c in captions])
    wrong_shape = reward(images, [_mismatched(c, 0, 2) for c in captions])
    assert (wrong_color <= 0.5).all() and wrong_color.mean() >= 0.47
    assert (wrong_shape <= 0.5).all() and wrong_shape.mean() >= 0.47


def test_grey_images_score_zero_for_every_caption(classifier):
    grey = torch.tensor(BACKGROUND, dtype=torch.float32).view(1, 3, 1, 1).expand(len(CAPTIONS), 3, 32, 32) / 255
    noisy = (grey + 0.05 * torch.randn(grey.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    for images in (grey, noisy):
        assert [shape for _, shape in classifier.read(images)] == [NOTHING] * len(CAPTIONS)
        color_ok, shape_ok = verdicts(classifier.read(images), list(CAPTIONS))
        assert color_ok.sum() == 0 and shape_ok.sum() == 0


def test_a_missing_asset_says_how_to_train_it(tmp_path):
    with pytest.raises(ConfigError, match="train_shape_classifier.py"):
        ShapeClassifier(tmp_path)
