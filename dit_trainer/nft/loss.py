"""DiffusionNFT's loss (Zheng et al., 2025, eq. 7 with the x0-space adaptive weighting of its code), for any
objective: the implicit policies mix the old and the trained predictions, and a prediction of the objective's
target is an affine function of the x0 it implies, so mixing predictions mixes their x0 alike
(``NoiseSchedule.predicted_x0``). With flow matching this is the published form exactly."""

from __future__ import annotations

import torch


def optimality(advantages: torch.Tensor, adv_clip_max: float) -> torch.Tensor:
    """r in [0, 1]: 1/2 + advantage / (2 ``adv_clip_max``), the advantages clipped to +- ``adv_clip_max``."""
    return (advantages.clamp(-adv_clip_max, adv_clip_max) / adv_clip_max / 2 + 0.5).clamp(0, 1)


def adaptive_error(x0_hat: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """(R,) mean squared error of ``x0_hat`` divided by its own (detached) mean absolute error: every row weighs
    about the same whatever its noise level."""
    dims = tuple(range(1, x0.ndim))
    error = x0_hat.float() - x0.float()
    scale = error.abs().mean(dim=dims).detach().clamp(min=1e-5)
    return error.square().mean(dim=dims) / scale


def nft_loss(
    x0: torch.Tensor, x0_old: torch.Tensor, x0_trained: torch.Tensor, optimality: torch.Tensor, beta: float
) -> torch.Tensor:
    """(R,) loss of the trained model's x0 prediction ``x0_trained`` against the rollout's clean latents ``x0``:
    the positive policy (1 - beta) old + beta trained pulled towards ``x0`` with weight r, the negative policy
    (1 + beta) old - beta trained with weight 1 - r; divided by beta, so beta sets how far from the old policy
    the implicit ones reach, not the gradient's size."""
    positive = (1 - beta) * x0_old + beta * x0_trained
    negative = (1 + beta) * x0_old - beta * x0_trained
    weighted = optimality * adaptive_error(positive, x0) + (1 - optimality) * adaptive_error(negative, x0)
    return weighted / beta
