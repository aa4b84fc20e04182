"""``digit_accuracy``: is the generated image the digit it was generated for? Judged by a classifier fitted on
scikit-learn's real digits; the prompt is the class (``"3"``). Offline; only meaningful for the digits recipe."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dit_trainer.data.sources.digits import DigitClassifier
from dit_trainer.rewards.base import Reward, check_reward_inputs


class DigitAccuracyReward:
    """1 where the classifier reads the prompt's digit, else 0: the mean over images is the accuracy."""

    name = "digit_accuracy"

    def __init__(self) -> None:
        self.classifier = DigitClassifier()

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_reward_inputs(images, prompts)
        predicted = self.classifier.predict(images)
        correct = [str(label) == prompt for label, prompt in zip(predicted, prompts)]
        return torch.tensor(correct, dtype=torch.float32, device=images.device)


DIGIT_ACCURACY = Reward(lambda cfg, device, dtype: DigitAccuracyReward())
