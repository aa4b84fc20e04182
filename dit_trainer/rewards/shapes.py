"""``shapes_alignment``: does the image show the captioned colour and shape? Read from the pixels, offline."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dit_trainer.data.shapes import score_alignment
from dit_trainer.rewards.base import check_reward_inputs


class ShapesAlignmentReward:
    """Range [0, 1]: 0.5 for the captioned colour plus 0.5 for the captioned shape (the shapes data set's judge)."""

    name = "shapes_alignment"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_reward_inputs(images, prompts)
        return score_alignment(images, list(prompts)).to(images.device)
