"""Statistics of an epoch's rollout images that show a reward being gamed before a gold judge does: their mean
brightness and saturation (an OCR reward that blacked out backgrounds, a compressibility reward that flattens images)
and how far apart the images of one prompt's group are (a policy collapsing onto one image a reward likes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

THUMBNAIL = 64  # the side the group distances are measured at: enough for layout and colour, cheap at any size


def brightness_and_saturation(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) mean luma (Rec. 601) and mean HSV saturation of (B, 3, H, W) images in [0, 1]."""
    images = images.float().clamp(0, 1)
    luma = (images * images.new_tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(dim=1)
    high, low = images.amax(dim=1), images.amin(dim=1)
    saturation = torch.where(high > 0, (high - low) / high.clamp(min=1e-8), 0.0)
    return luma.mean(dim=(1, 2)), saturation.mean(dim=(1, 2))


def thumbnails(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, s, s) images at ``THUMBNAIL`` px at most (area-averaged), float32."""
    size = min(THUMBNAIL, images.shape[-1], images.shape[-2])
    return F.adaptive_avg_pool2d(images.float(), size)


def group_diversity(thumbs: torch.Tensor, group_size: int) -> torch.Tensor:
    """(P,) mean pairwise RMS distance between the ``group_size`` images of each prompt (flattened prompt-major)."""
    groups = thumbs.flatten(1).view(-1, group_size, thumbs[0].numel())
    distances = torch.cdist(groups, groups) / thumbs[0].numel() ** 0.5
    pairs = group_size * (group_size - 1)
    return distances.sum(dim=(1, 2)) / pairs
