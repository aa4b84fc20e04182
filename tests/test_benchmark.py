"""FLOPs per image (``benchmark.count_flops``): counted on the meta device, where attention is counted for every
family (the CPU's fused attention kernel is not), with no memory spent on the copy."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dit_trainer.benchmark import _convolution_backward_flops, count_flops
from dit_trainer.condition import Condition

# family -> what its tiny transformer is conditioned on: (condition width, pooled width or None)
FAMILIES = {"pixart_alpha": (12, None), "dit": (10, None), "sd3": (12, 12), "flux": (12, 12), "sana": (12, None)}


def _inputs(family: str) -> tuple[torch.Tensor, torch.Tensor, Condition]:
    generator = torch.Generator().manual_seed(0)
    width, pooled = FAMILIES[family]
    x_t, t = torch.randn(2, 4, 8, 8, generator=generator), torch.tensor([100, 900])
    if family == "dit":
        return x_t, t, Condition(torch.tensor([1, 3]), torch.ones(2, 1))
    mask = torch.ones(2, 5, dtype=torch.long)
    pooled_vector = None if pooled is None else torch.randn(2, pooled, generator=generator)
    return x_t, t, Condition(torch.randn(2, 5, width, generator=generator), mask, pooled_vector)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_is_counted_with_its_attention(family, tiny_transformer):
    width, pooled = FAMILIES[family]
    dit = tiny_transformer(family, condition_dim=width, pooled_dim=pooled)
    inputs = _inputs(family)
    forward, training = count_flops(dit, *inputs)
    with FlopCounterMode(display=False) as on_cpu:
        dit(*inputs)
    per_image_on_cpu = on_cpu.get_total_flops() / len(inputs[0])
    assert forward > per_image_on_cpu > 0  # the CPU count misses the attention the meta count has
    assert 2.5 < training / forward < 3.5  # a backward costs about two forwards
    assert all(parameter.device.type == "cpu" for parameter in dit.parameters())  # counted on a copy


@pytest.mark.parametrize("groups", [1, 8])
def test_a_convolutions_backward_costs_two_forwards_whatever_its_groups(groups):
    """torch's own formula counts a depthwise convolution's weight gradient as a dense one (groups ignored)."""
    conv = torch.nn.Conv2d(8, 16, 3, padding=1, groups=groups).to("meta")
    x = torch.randn(2, 8, 10, 10, device="meta", requires_grad=True)
    corrected = {torch.ops.aten.convolution_backward: _convolution_backward_flops}
    with FlopCounterMode(display=False, custom_mapping=corrected) as counter:
        conv(x).sum().backward()
    counts = counter.get_flop_counts()["Global"]
    forward, backward = counts[torch.ops.aten.convolution], counts[torch.ops.aten.convolution_backward]
    assert forward == 2 * 16 * (8 // groups) * 9 * 2 * 100 and backward == 2 * forward
