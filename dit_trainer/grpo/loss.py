"""GRPO's policy loss: the PPO-clipped ratio of the new and old log-probabilities of the steps a rollout took,
weighted by advantages, and the KL penalty to the reference policy; plus the statistics worth watching."""

from __future__ import annotations

import torch


def clipped_policy_loss(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, clip_range: float
) -> torch.Tensor:
    """(N,) PPO's pessimistic surrogate, max(-A r, -A clip(r, 1 - c, 1 + c)) with r = exp(log_prob - old_log_prob):
    a step whose probability already moved more than the clip range in the advantage's direction gets no gradient."""
    ratio = torch.exp(log_prob - old_log_prob)
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip_range, 1 + clip_range))


def gaussian_kl(mean: torch.Tensor, reference_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(N,) KL(N(mean, std^2) || N(reference_mean, std^2)) per step, averaged over dimensions like the log-probs:
    (mean - reference_mean)^2 / (2 std^2). Both policies share the step's std, so only the means differ."""
    return ((mean.float() - reference_mean.float()) ** 2 / (2 * std.float() ** 2)).flatten(1).mean(dim=1)


def ratio_statistics(log_prob: torch.Tensor, old_log_prob: torch.Tensor, clip_range: float) -> dict[str, torch.Tensor]:
    """How far the update has moved the policy from the one that rolled out: the clipped share of steps, the
    approximate KL 0.5 E[(log r)^2] (Schulman's k2), and the ratio's range. Tensors, read at log time."""
    log_ratio = (log_prob - old_log_prob).detach()
    ratio = log_ratio.exp()
    return {
        "clip_frac": ((ratio - 1).abs() > clip_range).float().mean(),
        "approx_kl": 0.5 * (log_ratio**2).mean(),
        "ratio_mean": ratio.mean(),
        "ratio_min": ratio.min(),
        "ratio_max": ratio.max(),
    }
