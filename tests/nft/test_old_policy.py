"""DiffusionNFT's old policy (``nft/old_policy.py``): swapped in and out exactly, soft-updated on its schedule,
and restored from its state."""

import torch
from torch import nn

from dit_trainer.nft.old_policy import DecaySchedule, OldPolicy


def test_the_decay_is_flat_then_grows_to_its_cap():
    decay = DecaySchedule(flat=10, rate=0.01, max_decay=0.5)
    assert [decay(n) for n in (0, 9, 10, 30, 100)] == [0.0, 0.0, 0.0, 0.2, 0.5]


def test_the_old_weights_act_inside_the_swap_and_move_towards_the_trained_ones():
    layer = nn.Linear(3, 2)
    policy = OldPolicy(list(layer.parameters()), DecaySchedule(0, 0.25, 0.5))
    start = [p.detach().clone() for p in layer.parameters()]
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.add_(1.0)  # an update
    trained = [p.detach().clone() for p in layer.parameters()]
    with policy.swapped_in():
        assert all(torch.equal(p, s) for p, s in zip(layer.parameters(), start))
    assert all(torch.equal(p, t) for p, t in zip(layer.parameters(), trained))
    assert policy.update(updates=2) == 0.5  # old <- 0.5 old + 0.5 trained
    # float32 rounding of 0.5 old + 0.5 trained: a weight near -0.5 lands near 0, where a relative tolerance is none
    assert all(torch.allclose(old, s + 0.5, atol=1e-6) for old, s in zip(policy.weights, start))

    restored = OldPolicy(list(nn.Linear(3, 2).parameters()), DecaySchedule(0, 0.25, 0.5))
    restored.load_state_dict(policy.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(restored.weights, policy.weights))
