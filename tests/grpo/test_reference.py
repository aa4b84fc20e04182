"""The reference policy of the KL penalty (``grpo/reference.py``): a frozen copy of the starting weights, or under
LoRA the same model with its adapters off."""

import contextlib

import torch

from dit_trainer.components.lora import apply_lora
from dit_trainer.condition import Condition
from dit_trainer.config import LoRAConfig
from dit_trainer.grpo.loss import gaussian_kl
from dit_trainer.grpo.rollout import recompute_steps
from dit_trainer.online.reference import build_reference

from ..conftest import SHAPES_TRANSFORMER
from .conftest import GUIDANCE, PROMPTS, rollout_policy, tiny_roll_out, trained_rows


def test_full_fine_tuning_reference_is_a_frozen_copy_of_the_starting_weights(tiny_parts):
    """Before any change the reference's step means are the dit's exactly (KL 0); after the dit's weights move the
    KL is positive while the reference, a frozen copy, still gives the starting means."""
    policy = rollout_policy(tiny_parts.schedule)
    rollout = tiny_roll_out(tiny_parts, policy, PROMPTS[:1], group_size=2)
    dit = tiny_parts.dit
    reference = build_reference(dit, lora=False, autocast=contextlib.nullcontext)
    rows, steps = trained_rows(policy, torch.arange(2))

    _, mean, std = recompute_steps(dit, policy, rollout, rows, steps, GUIDANCE)
    _, reference_mean, _ = recompute_steps(reference, policy, rollout, rows, steps, GUIDANCE)
    assert mean.requires_grad and not reference_mean.requires_grad
    assert torch.equal(mean, reference_mean)
    assert torch.equal(gaussian_kl(mean, reference_mean, std), torch.zeros(len(rows)))

    reference_parameters = list(reference.model.parameters())
    assert not any(p.requires_grad for p in reference_parameters)
    assert not {p.data_ptr() for p in reference_parameters} & {p.data_ptr() for p in dit.parameters()}
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for p in dit.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    _, moved, _ = recompute_steps(dit, policy, rollout, rows, steps, GUIDANCE)
    _, reference_after, _ = recompute_steps(reference, policy, rollout, rows, steps, GUIDANCE)
    assert torch.equal(reference_after, reference_mean)
    assert (gaussian_kl(moved, reference_after, std) > 0).all()


def test_lora_reference_is_the_base_model_and_leaves_the_adapters_training(tiny_transformer):
    """Under LoRA the reference is the dit with its adapters off: the base model's prediction, not the adapted one.
    Called between a forward and its backward (as the KL term is), it leaves the adapters active and training."""
    dit = tiny_transformer(**SHAPES_TRANSFORMER).eval()
    generator = torch.Generator().manual_seed(0)
    x, t = torch.randn(2, 4, 16, 16, generator=generator), torch.tensor([500, 200])
    condition = Condition(torch.randn(2, 8, 384, generator=generator), torch.ones(2, 8, dtype=torch.long))
    with torch.no_grad():
        base = dit(x, t, condition)

    apply_lora(dit.transformer, LoRAConfig(rank=4, target_modules=["to_q", "to_v"]))
    adapters = {name: p for name, p in dit.named_parameters() if "lora_" in name}
    assert adapters and all(p.requires_grad for p in adapters.values())
    with torch.no_grad():
        for name, p in adapters.items():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=generator)
    adapted = dit(x, t, condition)
    assert (adapted - base).abs().max() > 1e-3

    reference = build_reference(dit, lora=True, autocast=contextlib.nullcontext)
    prediction = reference(x, t, condition)
    assert not prediction.requires_grad
    torch.testing.assert_close(prediction, base, rtol=0, atol=1e-6)

    assert all(p.requires_grad for p in adapters.values())
    torch.testing.assert_close(dit(x, t, condition).detach(), adapted.detach(), rtol=0, atol=1e-6)
    ((adapted - prediction) ** 2).mean().backward()
    assert all(p.grad is not None for p in adapters.values())
    assert any(p.grad.any() for name, p in adapters.items() if "lora_A" in name)
