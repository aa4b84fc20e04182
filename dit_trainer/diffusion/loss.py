"""Per-sample losses: (B,) first, reductions later (weighting, DP clipping and per-timestep curves need it)."""

from __future__ import annotations

import torch


def per_sample_mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over every dimension but the batch, in float32: shape (B,)."""
    return (prediction.float() - target.float()).pow(2).flatten(1).mean(dim=1)
