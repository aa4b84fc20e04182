"""Flow-GRPO-Fast's shared prefix (``roll_out(prefix_steps=...)``): a group starts from one noise and the
deterministic steps before the window are rolled out once per prompt, so a group's latents are the same until its
window and differ from there; the window's log-probs recompute to the rollout's in the training layout, so the first
update's ratio is still one."""

import pytest
import torch

from dit_trainer.grpo.rollout import recompute_steps

from .conftest import CPU, GROUP, GUIDANCE, PROMPTS, STEPS, schedule_of, tiny_roll_out, trained_rows

WINDOW_SIZE = 2


def windowed_policy(schedule, start: int = 2):
    """Noise in 2 of the 6 steps from ``start`` only, as a random or sliding window places it."""
    window = torch.zeros(STEPS, dtype=torch.bool)
    window[start : start + WINDOW_SIZE] = True
    return schedule.policy(STEPS, CPU, None, window)


@pytest.mark.parametrize("family", ["ddim", "flow"])
@pytest.mark.parametrize("start", [2, 0])
def test_a_group_shares_its_latents_until_the_window_and_branches_there(tiny_parts, family, start):
    """Window at 2: the noise and 2 deterministic steps shared; at 0: the noise alone."""
    policy = windowed_policy(schedule_of(family, tiny_parts), start)
    rollout = tiny_roll_out(tiny_parts, policy, prefix_steps=start)
    count = len(PROMPTS) * GROUP
    assert rollout.samples.shape == (count, STEPS + 1, *tiny_parts.latent_shape)
    groups = rollout.samples.view(len(PROMPTS), GROUP, STEPS + 1, -1)

    before = groups[:, :, : start + 1]  # the noise and the latents after the prefix's steps
    assert torch.equal(before, before[:, :1].expand_as(before))  # the same within each group
    assert not torch.equal(before[0], before[1])  # each prompt its own noise and condition
    after = groups[:, :, start + 1 :]  # from the first window step on
    assert all(
        not torch.equal(after[p, i, step], after[p, j, step])
        for p in range(len(PROMPTS))
        for i in range(GROUP)
        for j in range(i)
        for step in range(after.shape[2])
    )
    assert not rollout.log_probs[:, :start].any()
    assert rollout.log_probs[:, start : start + WINDOW_SIZE].ne(0).all()
    assert not rollout.log_probs[:, start + WINDOW_SIZE :].any()

    rows, steps = trained_rows(policy, torch.arange(count), shuffle=0)
    assert set(steps.tolist()) == {start, start + 1}
    with torch.no_grad():
        log_prob = recompute_steps(tiny_parts.dit, policy, rollout, rows, steps, GUIDANCE)[0]
    assert (log_prob - rollout.log_probs[rows, steps]).abs().max() <= 1e-5


def test_without_a_shared_prefix_every_image_has_its_own_noise(tiny_parts):
    """The default (``grpo.shared_prefix=false``): all G x prompts trajectories start from their own noise, and the
    steps before the window, deterministic, still differ within a group."""
    policy = windowed_policy(tiny_parts.schedule)
    rollout = tiny_roll_out(tiny_parts, policy)
    for step in range(3):
        assert torch.unique(rollout.samples[:, step].flatten(1), dim=0).shape[0] == len(PROMPTS) * GROUP
    assert not rollout.log_probs[:, :2].any()


def test_a_prefix_with_a_noisy_step_is_refused(tiny_parts):
    policy = windowed_policy(tiny_parts.schedule)
    with pytest.raises(AssertionError, match="no noise"):
        tiny_roll_out(tiny_parts, policy, prefix_steps=3)
