"""Per-sample losses: (B,) first, reductions later (weighting, DP clipping and per-timestep curves need it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def per_sample_mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over every dimension but the batch, in float32: shape (B,). ``mse_loss`` without
    reduction is one kernel forward and one backward (a subtraction and a power are two each)."""
    return F.mse_loss(prediction.float(), target.float(), reduction="none").flatten(1).mean(dim=1)
