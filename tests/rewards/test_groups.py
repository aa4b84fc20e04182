"""GRPO's group statistics (``rewards/groups.py``): rewards normalised within each prompt's group, groups without a
spread carrying no signal, and the keys the monitor logs."""

import pytest
import torch

from dit_trainer.rewards.groups import group_statistics, reward_metrics


def test_group_statistics_match_a_hand_computed_example():
    # Three prompts x G=4: a split group, a zero-std group, a 0.2/0.8 group.
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.2, 0.2, 0.8, 0.8])
    stats = group_statistics(rewards, group_size=4, eps=1e-4)
    torch.testing.assert_close(stats.mean, torch.tensor([0.5, 0.5, 0.5]))
    torch.testing.assert_close(stats.std, torch.tensor([0.5, 0.0, 0.3]))
    expected = torch.tensor([0.5, -0.5, 0.5, -0.5]) / 0.5001
    torch.testing.assert_close(stats.advantages[:4], expected)
    assert torch.equal(stats.advantages[4:8], torch.zeros(4))  # no signal from a group that agrees
    torch.testing.assert_close(stats.advantages[8:], torch.tensor([-0.3, -0.3, 0.3, 0.3]) / 0.3001)
    global_std = rewards.std(correction=0)  # sqrt(mean((r - 0.5)^2)) = sqrt((4 * .25 + 4 * .09) / 12)
    torch.testing.assert_close(global_std, torch.tensor((1.36 / 12) ** 0.5))
    torch.testing.assert_close(
        stats.advantages_global_std[:4], torch.tensor([0.5, -0.5, 0.5, -0.5]) / (global_std + 1e-4)
    )
    assert stats.zero_std_fraction == pytest.approx(1 / 3)


def test_group_statistics_refuse_a_ragged_batch():
    with pytest.raises(ValueError, match="P x 4"):
        group_statistics(torch.zeros(10), group_size=4)


def test_reward_metrics_are_the_keys_the_monitor_logs():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
    metrics = reward_metrics({"shapes_alignment": rewards}, rewards, group_size=2)
    assert metrics["reward/mean"] == pytest.approx(0.5) and metrics["reward/shapes_alignment"] == pytest.approx(0.5)
    assert metrics["grpo/zero_std_frac"] == pytest.approx(0.5)
    assert metrics["grpo/adv_abs_mean"] == pytest.approx(0.5 * 0.5 / 0.5001)
    assert {"reward/std", "grpo/adv_abs_mean_global_std", "grpo/group_std_mean"} <= set(metrics)


@pytest.mark.parametrize(
    ("values", "group_size"),
    [
        ([0.5, 1.0, -2.0], 4),
        ([2.7, 0.7, 0.1], 16),  # the float mean of 16 equal rewards is off by rounding: std and advantage stay 0
        ([2.7], 16),
    ],
    ids=["exact", "default-group-size", "one-group"],
)
def test_groups_of_equal_rewards_carry_no_signal(values, group_size):
    """An epoch where every group's rewards are equal: every advantage (group and global std) is exactly 0 and
    finite, every group std is 0 and zero_std_fraction is 1; one group with a spread is counted as such."""
    rewards = torch.tensor(values).repeat_interleave(group_size)
    stats = group_statistics(rewards, group_size)
    assert stats.zero_std_fraction == 1.0
    assert torch.equal(stats.std, torch.zeros(len(values)))
    torch.testing.assert_close(stats.mean, torch.tensor(values))
    for advantages in (stats.advantages, stats.advantages_global_std):
        assert torch.isfinite(advantages).all()
        assert torch.equal(advantages, torch.zeros(len(rewards)))

    rewards[0] += 1.0
    stats = group_statistics(rewards, group_size)
    assert stats.zero_std_fraction == pytest.approx(1 - 1 / len(values))
    assert stats.advantages[0] > 0 and (stats.advantages[1:group_size] < 0).all()
