"""Which prompts each GRPO epoch rolls out (``grpo/prompts.py``): ``spread`` sampling draws prompts by their recent
reward spread, and a prompt not rolled out yet counts as the most uncertain whatever the rewards' scale."""

from collections import Counter

import pytest
import torch

from dit_trainer.online.prompts import PromptSampler


def _drawn(sampler: PromptSampler, draws: int = 2000) -> Counter:
    generator = torch.Generator().manual_seed(0)
    return Counter(sampler.draw(generator)[0] for _ in range(draws))


def test_unseen_prompts_are_drawn_like_the_most_uncertain_seen_one_when_rewards_spread_beyond_one():
    """A sum of rewards, or a CLIP score, spreads beyond 1: an unseen prompt must not fall to the floor."""
    sampler = PromptSampler(["a", "b", "c", "d"], 1, "spread")
    sampler.observe(torch.tensor([0, 1]), torch.tensor([5.0, 4.0]))
    assert sampler.weights().tolist() == pytest.approx([1.0, 0.8, 1.0, 1.0])
    counts = _drawn(sampler)
    assert min(counts[2], counts[3]) > 0.8 * counts[0] and counts[1] < counts[0]


def test_with_rewards_in_zero_one_unseen_prompts_keep_their_weight_and_solved_ones_the_floor():
    sampler = PromptSampler(["a", "b", "c", "d"], 1, "spread")
    sampler.observe(torch.tensor([0, 1]), torch.tensor([0.3, 0.0]))
    assert sampler.weights().tolist() == pytest.approx([0.3, 0.1, 1.0, 1.0])
    sampler.observe(torch.tensor([2, 3]), torch.tensor([0.2, 0.1]))
    assert sampler.weights().tolist() == pytest.approx([1.0, 0.1, 2 / 3, 1 / 3])


def test_a_resumed_sampler_restores_its_statistics_by_prompt_text():
    """A resume with the same list draws as the uninterrupted run; one with a changed list (allowed by
    `trainer.allow_config_change=true`; it crashed on the size mismatch) keeps the statistics of the prompts kept."""
    sampler = PromptSampler(["a", "b", "c"], 1, "spread")
    sampler.observe(torch.tensor([0, 1, 2]), torch.tensor([0.3, 0.0, 0.2]))
    state = sampler.state_dict()
    same = PromptSampler(["a", "b", "c"], 1, "spread")
    same.load_state_dict(state)
    assert same.weights().tolist() == sampler.weights().tolist()
    changed = PromptSampler(["c", "new", "a"], 1, "spread")
    changed.load_state_dict(state)
    assert changed.seen.tolist() == [True, False, True]
    assert changed.weights().tolist() == pytest.approx([0.2, 1.0, 0.3])  # "new" counts as the most uncertain
    older = PromptSampler(["x", "y"], 1, "spread")  # a checkpoint that did not record its prompts, of another size
    older.load_state_dict({"spread": state["spread"], "seen": state["seen"]})
    assert not older.seen.any()
