"""The non-finite policy (``training/nonfinite.py``): NaN/inf steps are skipped and counted, and too many in a row
stop the run with a report."""

import pytest
import torch
from accelerate import Accelerator

from dit_trainer.errors import NonFiniteError
from dit_trainer.training.checkpoint import TrainingState
from dit_trainer.training.nonfinite import NonFiniteGuard


def _guard(model: torch.nn.Module, max_consecutive: int = 3) -> NonFiniteGuard:
    state = TrainingState(torch.Generator())
    advice = ["lower the learning rate (`optim.lr=0.001` -> e.g. `optim.lr=0.0001`)"]
    return NonFiniteGuard(Accelerator(cpu=True), model, state, max_consecutive, advice, lambda: 1e-3)


def test_non_finite_steps_are_skipped_counted_and_then_stop_the_run_with_a_report():
    model = torch.nn.Linear(2, 2)
    model.weight.grad = torch.full_like(model.weight, float("nan"))
    guard = _guard(model)
    finite, nan = torch.tensor(1.0), torch.tensor(float("nan"))
    assert not guard.check(nan, finite) and not guard.check(finite, grad_norm=nan)
    assert guard.check(finite, grad_norm=torch.tensor(2.0))  # a finite step resets the count of consecutive ones
    assert guard.state.skipped_steps == 2
    assert not guard.check(nan, finite) and not guard.check(nan, finite)
    with pytest.raises(NonFiniteError) as caught:
        guard.check(nan, grad_norm=nan)
    message = str(caught.value)
    assert guard.state.skipped_steps == 5
    assert "for 3 consecutive steps (`trainer.max_consecutive_nonfinite=3`)" in message
    assert "Parameters with non-finite gradients: weight." in message and "`optim.lr=0.0001`" in message
