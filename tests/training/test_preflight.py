"""The preflight (``training/preflight.py``): before the first step the gradient-flow doctor runs on the real loss,
and a problem is its explanation, not PyTorch's error."""

import pytest
import torch

from dit_trainer.errors import GradientFlowError
from dit_trainer.training.preflight import preflight

from ..conftest import tiny_loss


def test_preflight_turns_a_planted_no_grad_into_the_doctor_s_explanation(tiny_parts, image_batch):
    tiny_parts.dit.forward = torch.no_grad()(tiny_parts.dit.forward)  # the planted bug
    with pytest.raises(GradientFlowError) as caught:
        preflight(tiny_parts.dit, lambda: tiny_loss(tiny_parts, image_batch).mean())
    message = str(caught.value)
    assert "[grad_disabled]" in message and "DiTAdapter" in message and "torch.no_grad" in message
    assert not isinstance(caught.value.__cause__, RuntimeError)  # the doctor's words, not PyTorch's error


def test_preflight_names_parameters_that_get_no_gradient(tiny_parts, image_batch):
    tiny_parts.dit.transformer.register_parameter("orphan", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(GradientFlowError, match=r"(?s)\[unused_params\].*`transformer\.orphan`"):
        preflight(tiny_parts.dit, lambda: tiny_loss(tiny_parts, image_batch).mean())


def test_preflight_refuses_a_fully_frozen_dit(tiny_parts, image_batch):
    tiny_parts.dit.requires_grad_(False)
    with pytest.raises(GradientFlowError, match=r"\[no_trainable_params\]"):
        preflight(tiny_parts.dit, lambda: tiny_loss(tiny_parts, image_batch).mean())


def test_preflight_passes_a_healthy_step_and_changes_nothing(tiny_parts, image_batch):
    before = {name: p.detach().clone() for name, p in tiny_parts.dit.named_parameters()}
    preflight(tiny_parts.dit, lambda: tiny_loss(tiny_parts, image_batch).mean())
    assert all(p.grad is None and torch.equal(p, before[n]) for n, p in tiny_parts.dit.named_parameters())
