"""Rollouts (``grpo/rollout.py``): the log-probs a training forward recomputes are those the rollout drew, so the
first update's ratio is one."""

import pytest
import torch

from dit_trainer.grpo.loss import clipped_policy_loss, ratio_statistics
from dit_trainer.grpo.rollout import recompute_steps

from .conftest import CLIP, GROUP, GUIDANCE, PROMPTS, STEPS, rollout_policy, schedule_of, tiny_roll_out, trained_rows


@pytest.mark.parametrize("family", ["ddim", "flow"])
def test_recomputed_log_probs_are_the_rollouts_and_the_first_ratio_is_one(tiny_parts, family):
    """With the weights that rolled out, one shuffled batch of every (trajectory, trained step) recomputes each
    step's log-prob to within 1e-5, whatever rollout batch it was drawn in; so the first update's ratio is 1 and
    nothing is clipped even at clip range 1e-4."""
    policy = rollout_policy(schedule_of(family, tiny_parts))
    assert policy.stochastic[:-1].all() and not policy.stochastic[-1]
    rollout = tiny_roll_out(tiny_parts, policy)
    count = len(PROMPTS) * GROUP
    assert rollout.samples.shape == (count, STEPS + 1, *tiny_parts.latent_shape)
    assert rollout.log_probs.shape == (count, STEPS) and not rollout.log_probs[:, -1].any()
    assert rollout.log_probs[:, :-1].ne(0).all()

    rows, steps = trained_rows(policy, torch.arange(count), shuffle=0)
    with torch.no_grad():
        log_prob, mean, std = recompute_steps(tiny_parts.dit, policy, rollout, rows, steps, GUIDANCE)
    old = rollout.log_probs[rows, steps]
    assert log_prob.shape == (len(rows),) and (std > 0).all()
    assert (log_prob - old).abs().max() <= 1e-5
    # The recomputation really is of each row's own step: a wrong trajectory or step would not be this close.
    assert (log_prob - rollout.log_probs[rows.roll(1), steps]).abs().max() > 1e-3
    assert (log_prob - rollout.log_probs[rows, steps.roll(1)]).abs().max() > 1e-3

    advantages = torch.linspace(-1, 1, count)[rows]
    ratio = ratio_statistics(log_prob, old, CLIP)
    assert ratio["clip_frac"] == 0
    assert abs(ratio["ratio_min"] - 1) <= 1e-5 and abs(ratio["ratio_max"] - 1) <= 1e-5
    torch.testing.assert_close(clipped_policy_loss(log_prob, old, advantages, CLIP), -advantages, rtol=0, atol=1e-5)
