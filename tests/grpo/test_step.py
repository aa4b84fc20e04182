"""The GRPO step (``grpo/step.py``): each trajectory trains its own random steps of the window, drawn from the
generator alone; and the GRPO modules import first, before the training loop."""

import importlib
import sys

import pytest
import torch

from dit_trainer.grpo.step import steps_to_train


def test_each_trajectory_trains_its_own_random_steps_of_the_window():
    """``grpo.steps_per_trajectory=k``: k distinct steps of the window per trajectory, not the same k for all, drawn
    from the generator alone (a resumed run, whose generator is restored, draws the same); null or the whole window
    takes every step in order, drawing nothing."""
    window = torch.tensor([2, 3, 4, 5])
    generator = torch.Generator().manual_seed(0)
    steps = steps_to_train(window, 64, 2, generator)
    assert steps.shape == (64, 2)
    assert all(len(set(row)) == 2 and set(row) <= {2, 3, 4, 5} for row in steps.tolist())
    assert len({tuple(sorted(row)) for row in steps.tolist()}) > 1
    assert torch.equal(steps, steps_to_train(window, 64, 2, torch.Generator().manual_seed(0)))
    assert (torch.bincount(steps.flatten(), minlength=6)[2:] > 16).all()  # each step about 32 times of 128

    state = generator.get_state()
    for k in (None, 4):
        assert steps_to_train(window, 3, k, generator).tolist() == [[2, 3, 4, 5]] * 3
    assert torch.equal(generator.get_state(), state)


@pytest.mark.parametrize("module", ["dit_trainer.grpo.build", "dit_trainer.grpo.step"])
def test_grpo_modules_import_first(module):
    """A GRPO module imports when neither it nor the training loop has been imported yet, as in a fresh
    interpreter. (Here the loop's modules are dropped from ``sys.modules`` and put back afterwards; the privacy
    module stays, its import registers Opacus grad samplers.)"""
    import dit_trainer
    import dit_trainer.grpo
    import dit_trainer.training  # noqa: F401  the state to put back

    def loop() -> list[str]:
        return [
            name
            for name in sys.modules
            if name.startswith(("dit_trainer.training", "dit_trainer.grpo."))
            and name != "dit_trainer.training.parallel.privacy"
        ]

    saved = {name: sys.modules.pop(name) for name in loop()}
    training, grpo_attributes = dit_trainer.training, dict(vars(dit_trainer.grpo))
    try:
        importlib.import_module(module)
    finally:
        for name in loop():
            del sys.modules[name]
        sys.modules.update(saved)
        dit_trainer.training = training
        vars(dit_trainer.grpo).clear()
        vars(dit_trainer.grpo).update(grpo_attributes)
