"""The embedded moving shapes clips (``data=moving_shapes``): every caption equally often, the same clip per index,
motion along the captioned direction, and a judge (the ``moving_shapes_alignment`` reward) that reads colour, shape
and direction back from the frames, and not from a clip that shows another."""

import pytest
import torch

from dit_trainer.data.sources.moving_shapes import CAPTIONS, MovingShapesDataset, judge
from dit_trainer.rewards.shapes import MovingShapesAlignmentReward


def clips_and_captions(count: int, frames: int = 4) -> tuple[torch.Tensor, list[str]]:
    dataset = MovingShapesDataset(count, 32, frames)
    items = [dataset[i] for i in range(count)]
    return torch.stack([item["image"] for item in items]), [item["caption"] for item in items]


def test_clips_cycle_through_every_caption_and_repeat_per_index():
    clips, captions = clips_and_captions(96)
    assert clips.shape == (96, 3, 4, 32, 32) and clips.min() >= -1 and clips.max() <= 1
    assert sorted(captions) == sorted(CAPTIONS) and len(CAPTIONS) == 96
    assert torch.equal(MovingShapesDataset(96, 32, 4)[7]["image"], clips[7])
    assert MovingShapesDataset(4, 32, 1)[0]["image"].shape == (3, 32, 32)  # one frame: an image


def test_the_judge_reads_colour_shape_and_direction_back_and_refuses_the_wrong_ones():
    clips, captions = clips_and_captions(96, frames=5)
    pixels = (clips + 1) / 2
    assert judge(pixels, captions) == {"color": 1.0, "shape": 1.0, "direction": 1.0}
    backwards = pixels.flip(2)  # played in reverse: every clip moves the other way
    assert judge(backwards, captions)["direction"] == 0.0
    still = pixels[:, :, :1].expand_as(pixels)  # no motion: no direction
    assert judge(still, captions) == {"color": 1.0, "shape": 1.0, "direction": 0.0}
    reward = MovingShapesAlignmentReward()(backwards, captions)
    assert torch.allclose(reward, torch.full((96,), 2 / 3))
    with pytest.raises(ValueError, match="clips"):
        reward = MovingShapesAlignmentReward()(pixels[:, :, 0], captions)
