"""The rollout images' statistics (``online/image_stats.py``) that show a gamed reward: brightness, saturation and
the spread within a prompt's group."""

import torch

from dit_trainer.online.image_stats import brightness_and_saturation, group_diversity, thumbnails


def test_brightness_and_saturation_of_known_colours():
    red = torch.tensor([1.0, 0, 0]).view(3, 1, 1).expand(3, 4, 4)
    images = torch.stack([torch.zeros(3, 4, 4), torch.ones(3, 4, 4), red])
    brightness, saturation = brightness_and_saturation(images)
    assert torch.allclose(brightness, torch.tensor([0.0, 1.0, 0.299]))
    assert torch.allclose(saturation, torch.tensor([0.0, 0.0, 1.0]))


def test_a_collapsed_group_has_no_diversity_and_a_varied_one_has_some():
    generator = torch.Generator().manual_seed(0)
    same = torch.rand(1, 3, 80, 80, generator=generator).expand(4, -1, -1, -1)
    varied = torch.rand(4, 3, 80, 80, generator=generator)
    thumbs = thumbnails(torch.cat([same, varied]))
    assert thumbs.shape == (8, 3, 64, 64)
    diversity = group_diversity(thumbs, group_size=4)
    assert diversity[0] == 0 and diversity[1] > 0.1
