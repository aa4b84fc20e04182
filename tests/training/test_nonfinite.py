"""The non-finite policy (``training/nonfinite.py``): NaN/inf steps are skipped and counted, and too many in a row
stop the run with a report."""

import pytest
import torch
from accelerate import Accelerator

from dit_trainer.config import OptimConfig, PrivacyConfig
from dit_trainer.errors import NonFiniteError
from dit_trainer.training.nonfinite import NonFiniteGuard, nonfinite_advice
from dit_trainer.training.state.training_state import TrainingState


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


def test_fp16_scaler_overflows_are_counted_apart_and_stop_nothing_until_the_scale_collapses():
    """From 2^16, the grad scaler halves its scale on each overflow: a run's first steps overflow by design, and a
    limit of 3 non-finite steps in a row must not stop it. Below a scale of 1 the gradients overflow unscaled."""
    guard = _guard(torch.nn.Linear(2, 2))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(torch.tensor(1.0))  # the scale exists once a loss was scaled
    guard.accelerator.scaler = scaler  # what accelerate sets with mixed_precision=fp16 on a GPU
    finite, inf = torch.tensor(1.0), torch.tensor(float("inf"))
    for _ in range(10):
        assert not guard.check(finite, grad_norm=inf)
    assert guard.state.scaler_overflows == 10 and guard.state.skipped_steps == 0
    assert not guard.check(inf, grad_norm=inf) and guard.state.skipped_steps == 1  # a non-finite loss is no overflow
    assert guard.check(finite, grad_norm=finite)
    scaler.update(new_scale=0.5)
    assert not guard.check(finite, grad_norm=inf) and not guard.check(finite, grad_norm=inf)
    with pytest.raises(NonFiniteError):
        guard.check(finite, grad_norm=inf)
    assert guard.state.scaler_overflows == 10 and guard.state.skipped_steps == 4


def test_the_report_advises_only_the_fixes_the_run_has_not_made():
    unclipped_fp16 = nonfinite_advice(OptimConfig(lr=1e-3, max_grad_norm=0.0), PrivacyConfig(), "fp16")
    assert [advice.split(" (")[0] for advice in unclipped_fp16] == [
        "lower the learning rate",
        "train in bf16",
        "clip gradients",
    ]
    assert "`optim.lr=0.0001`" in unclipped_fp16[0]
    # bf16 does not overflow, and DP-SGD clips every sample already
    assert len(nonfinite_advice(OptimConfig(max_grad_norm=0.0), PrivacyConfig(enabled=True), "bf16")) == 1
