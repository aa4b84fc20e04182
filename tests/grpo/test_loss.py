"""GRPO's policy loss (``grpo/loss.py``): the clipped loss moves the policy in the advantage's direction and no
further than the clip range, zero advantages give no gradient, and the KL penalty is that of two Gaussians."""

import pytest
import torch

from dit_trainer.grpo.loss import clipped_policy_loss, gaussian_kl, ratio_statistics
from dit_trainer.grpo.rollout import recompute_steps

from .conftest import CLIP, GUIDANCE, PROMPTS, rollout_policy, tiny_roll_out, trained_rows


def test_the_clip_stops_the_gradient_only_past_the_range_in_the_advantages_direction():
    """PPO's pessimistic clip: a ratio past 1 + c with A > 0 (or below 1 - c with A < 0) has zero gradient w.r.t. the
    log-prob; within the range, or past it against the advantage, the gradient is -A r. clip_frac counts |r - 1| > c."""
    c = 0.2
    ratio = torch.tensor([1.0, 1.1, 1.3, 0.5, 0.9, 1.5, 0.5], dtype=torch.float64)
    advantages = torch.tensor([1.0, 2.0, 1.0, -1.0, -2.0, -3.0, 0.5], dtype=torch.float64)
    clipped = torch.tensor([False, False, True, True, False, False, False])
    old = torch.tensor([0.3, -1.0, 2.0, 0.0, -0.5, 1.0, -2.0], dtype=torch.float64)
    log_prob = (old + ratio.log()).requires_grad_(True)

    loss = clipped_policy_loss(log_prob, old, advantages, c)
    expected = torch.where(clipped, -advantages * ratio.clamp(1 - c, 1 + c), -advantages * ratio)
    torch.testing.assert_close(loss.detach(), expected)
    loss.sum().backward()
    torch.testing.assert_close(log_prob.grad, torch.where(clipped, 0.0, -advantages * ratio))
    assert (log_prob.grad[clipped] == 0).all() and (log_prob.grad[~clipped] != 0).all()

    stats = ratio_statistics(log_prob, old, c)
    assert stats["clip_frac"].item() == pytest.approx(4 / 7)  # 1.3, 0.5, 1.5, 0.5
    assert stats["approx_kl"].item() == pytest.approx(0.5 * (ratio.log() ** 2).mean().item())
    assert stats["ratio_min"].item() == pytest.approx(0.5) and stats["ratio_max"].item() == pytest.approx(1.5)
    assert stats["ratio_mean"].item() == pytest.approx(ratio.mean().item())
    assert not stats["clip_frac"].requires_grad
    zero = ratio_statistics(old.clone(), old, c)
    assert zero["clip_frac"] == 0 and zero["approx_kl"] == 0


def test_a_positive_advantage_raises_its_trajectorys_log_probs_and_zero_advantages_give_no_gradient(tiny_parts):
    """One SGD step on the clipped loss of a trajectory with advantage +1 makes its steps more likely (mean log-prob
    up), one with -1 less likely; with all advantages 0 every parameter's gradient is exactly zero."""
    policy = rollout_policy(tiny_parts.schedule)
    rollout = tiny_roll_out(tiny_parts, policy, PROMPTS[:1], group_size=2)
    dit = tiny_parts.dit
    rows, steps = trained_rows(policy, torch.tensor([1]))
    old = rollout.log_probs[rows, steps]
    initial = {name: p.detach().clone() for name, p in dit.named_parameters()}

    def step(advantage: float) -> torch.Tensor:
        """The change of trajectory 1's mean trained-step log-prob after one SGD step at ``advantage``."""
        with torch.no_grad():
            for name, p in dit.named_parameters():
                p.copy_(initial[name])
        advantages = torch.tensor([0.0, advantage])
        dit.zero_grad(set_to_none=True)
        log_prob = recompute_steps(dit, policy, rollout, rows, steps, GUIDANCE)[0]
        clipped_policy_loss(log_prob, old, advantages[rows], CLIP).mean().backward()
        torch.optim.SGD(dit.parameters(), lr=1e-2).step()
        with torch.no_grad():
            after = recompute_steps(dit, policy, rollout, rows, steps, GUIDANCE)[0]
        return after.mean() - log_prob.detach().mean()

    assert step(1.0) > 1e-5
    assert step(-1.0) < -1e-5

    with torch.no_grad():
        for name, p in dit.named_parameters():
            p.copy_(initial[name])
    dit.zero_grad(set_to_none=True)
    all_rows, all_steps = trained_rows(policy, torch.arange(2))
    log_prob = recompute_steps(dit, policy, rollout, all_rows, all_steps, GUIDANCE)[0]
    old = rollout.log_probs[all_rows, all_steps]
    clipped_policy_loss(log_prob, old, torch.zeros(len(all_rows)), CLIP).mean().backward()
    grads = [p.grad for p in dit.parameters()]
    assert any(g is not None for g in grads)  # the graph did reach the parameters
    assert all(g is None or not g.any() for g in grads)


def test_gaussian_kl_is_the_mean_squared_gap_over_twice_the_variance():
    """KL of two Gaussians with one std: (m - m_ref)^2 / (2 std^2) averaged over dimensions; 0 for equal means."""
    generator = torch.Generator().manual_seed(0)
    mean, reference = torch.randn(3, 4, 2, 2, generator=generator), torch.randn(3, 4, 2, 2, generator=generator)
    std = torch.tensor([0.5, 1.0, 2.0]).view(3, 1, 1, 1)
    assert torch.equal(gaussian_kl(mean, mean, std), torch.zeros(3))
    normal = torch.distributions.Normal
    expected = torch.distributions.kl_divergence(normal(mean, std), normal(reference, std)).mean(dim=(1, 2, 3))
    torch.testing.assert_close(gaussian_kl(mean, reference, std), expected)
