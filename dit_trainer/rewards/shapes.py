"""The shapes data sets' judges as rewards, read from the pixels, offline: ``shapes_alignment`` (does the image show
the captioned colour and shape?), ``shapes_margin`` (how clearly does it show the captioned shape?) and
``moving_shapes_alignment`` (does the clip show the captioned colour, shape and direction?)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dit_trainer.data.sources.moving_shapes import alignment_components
from dit_trainer.data.sources.shapes import COLORS, SHAPES, is_shapes_caption, score_alignment, shape_margins
from dit_trainer.rewards.base import Reward, check_reward_inputs


class ShapesAlignmentReward:
    """Range [0, 1]: 0.5 for the captioned colour plus 0.5 for the captioned shape (the shapes data set's judge)."""

    name = "shapes_alignment"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_reward_inputs(images, prompts)
        return score_alignment(images, list(prompts)).to(images.device)


class ShapesMarginReward:
    """Range [-1, 1]: the judge's template IoU of the captioned shape minus the best other shape's. A verdict is
    0 or 1, so a group whose images are all judged right carries no GRPO signal; the margin still ranks them by how
    far each is from being misread."""

    name = "shapes_margin"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_reward_inputs(images, prompts)
        return shape_margins(images, list(prompts)).to(images.device)


class MovingShapesAlignmentReward:
    """Range [0, 1]: a third each for the captioned colour, shape and direction of a clip (B, 3, F, H, W) (the
    moving shapes data set's judge)."""

    name = "moving_shapes_alignment"

    @torch.no_grad()
    def __call__(self, clips: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_reward_inputs(clips, prompts, clips=True)
        if clips.ndim == 4:
            raise ValueError("moving_shapes_alignment judges clips (B, 3, F, H, W): a direction needs frames")
        components = alignment_components(clips, list(prompts))
        return (sum(components.values()) / len(components)).to(clips.device)


SHAPES_PROMPTS = f'"a COLOUR SHAPE", a colour of {", ".join(COLORS)} and a shape of {", ".join(SHAPES)}'
SHAPES_ALIGNMENT = Reward(lambda cfg, device, dtype: ShapesAlignmentReward(), judges=is_shapes_caption,
                          judged_prompts=SHAPES_PROMPTS)  # fmt: skip
SHAPES_MARGIN = Reward(lambda cfg, device, dtype: ShapesMarginReward(), judges=is_shapes_caption,
                       judged_prompts=SHAPES_PROMPTS)  # fmt: skip
MOVING_SHAPES_ALIGNMENT = Reward(lambda cfg, device, dtype: MovingShapesAlignmentReward(), takes="clips")
