"""The run's DiT on the meta device: what one forward and backward costs (FLOPs, the activations autograd keeps),
counted at any model size with no memory and no time. Tensors there have shapes and dtypes but no data, so a copy
of a 12 B model costs nothing, and every op reaches a kernel the counters see (attention included, which on the
CPU hides inside a fused kernel that torch's FLOP counter does not know)."""

from __future__ import annotations

import contextlib
import copy
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from dit_trainer.components.autocast_policy import AutocastPolicy
from dit_trainer.components.build import Components
from dit_trainer.components.dit import DiTAdapter
from dit_trainer.condition import Condition

META = torch.device("meta")


def meta_copy(module: nn.Module) -> nn.Module:
    """``module`` with its parameters and buffers on the meta device (shapes, dtypes, ``requires_grad`` and ties
    kept), made without copying a single weight."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        empty = torch.empty_like(tensor, device=META)
        memo[id(tensor)] = nn.Parameter(empty, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else empty
    return copy.deepcopy(module, memo)


def meta_inputs(parts: Components, batch: int) -> tuple[torch.Tensor, torch.Tensor, Condition]:
    """(x_t, t, condition) of ``batch`` images at the run's latent shape, on the meta device. The condition is the
    empty prompt's: every conditioner pads to a fixed length, so its shapes are any caption's."""
    shape = (batch, *parts.latent_shape)
    cpu = torch.device("cpu")
    t = parts.schedule.at_size(shape).sample_timesteps(batch, cpu, torch.Generator(cpu).manual_seed(0))
    condition = parts.text_encoder.encode([""]).to(META).rows([0] * batch)
    return torch.zeros(shape, device=META), t.to(META), condition


def _convolution_backward_flops(
    grad_out_shape,
    x_shape,
    w_shape,
    bias,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    output_mask,
    **_,
) -> int:
    """torch's formula for a convolution's backward ignores ``groups``: it counts a depthwise convolution's weight
    gradient as a dense one's (Sana's GLUMBConv feed-forward: its training FLOPs came out 14x its forward's). Each
    multiply of the forward is one multiply of each gradient, whatever the groups, so each gradient asked for costs
    one forward."""
    forward = conv_flop_count(x_shape, w_shape, grad_out_shape, transposed)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


def count_flops(dit: nn.Module, x_t: torch.Tensor, t: torch.Tensor, condition: Condition) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs per image of ``dit`` on these inputs, counted on a meta copy."""
    dit = meta_copy(dit)
    x_t, t, condition = x_t.to(META), t.to(META), condition.to(META)
    corrected = {torch.ops.aten.convolution_backward: _convolution_backward_flops}
    with FlopCounterMode(display=False, custom_mapping=corrected) as forward:
        dit(x_t, t, condition)
    with FlopCounterMode(display=False, custom_mapping=corrected) as training:
        dit(x_t, t, condition).float().pow(2).mean().backward()
    return forward.get_total_flops() / len(x_t), training.get_total_flops() / len(x_t)


class _FusedAttention(TorchFunctionMode):
    """Attention as a GPU runs it: on the meta device SDPA takes its math path, which keeps the (B, heads, N, M)
    score and probability matrices for backward, where a GPU's fused kernels keep only the output and its
    log-sum-exp (at 4,096 tokens the difference is 2 GiB per block per image). This routes it to the
    memory-efficient kernel's op, which has a meta implementation and keeps what the GPU keeps."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        return _efficient_attention(*args, **kwargs)


def _efficient_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
) -> torch.Tensor:
    """``F.scaled_dot_product_attention``'s arguments, run by the memory-efficient kernel's op (a grouped-query
    call keeps the math path: no DiT family makes one)."""
    if enable_gqa:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # the kernel takes an additive bias
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=META).masked_fill(~attn_mask, -torch.inf)
    if attn_mask is not None:
        attn_mask = attn_mask.expand(*query.shape[:-2], query.shape[-2], key.shape[-2])
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention
    return efficient(query, key, value, attn_mask, True, dropout_p, is_causal, scale=scale)[0]


@dataclass(frozen=True)
class Activations:
    """Bytes autograd keeps from one forward until its backward: the saves ``outside`` the blocks, each block's own
    (``inside``) and the floating inputs each block was the first to be given (``inputs``: a tensor every block
    takes, such as the timestep embedding, is the first block's)."""

    outside: int
    inside: tuple[int, ...]
    inputs: tuple[int, ...]

    @property
    def whole(self) -> int:
        """Without gradient checkpointing."""
        return self.outside + sum(self.inside)

    def __sub__(self, other: Activations) -> Activations:
        """What ``self`` keeps beyond ``other`` (each part at least 0): the larger batch's extra images."""

        def minus(mine: tuple[int, ...], theirs: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(max(0, a - b) for a, b in zip(mine, theirs))

        return Activations(max(0, self.outside - other.outside), minus(self.inside, other.inside),
                           minus(self.inputs, other.inputs))  # fmt: skip

    def checkpointed(self, every: int = 1) -> int:
        """With every ``every``-th block checkpointed: those keep only their inputs, the others their saves, and
        backward adds one checkpointed block's saves while it recomputes it."""
        recomputed = range(0, len(self.inside), every)
        kept = self.whole - sum(self.inside[i] for i in recomputed) + sum(self.inputs[i] for i in recomputed)
        return kept + max((self.inside[i] for i in recomputed), default=0)


def saved_activations(dit: DiTAdapter, inputs: tuple, autocast: tuple[str, torch.dtype] | None = None) -> Activations:
    """What one forward of ``dit`` (a meta copy, which this changes) on ``inputs`` keeps for backward, counted by
    ``saved_tensors_hooks``: each storage once, parameters (counted as weights) never. ``autocast``: (device type,
    dtype) of the run's mixed precision, whose casts the forward replays (``AutocastPolicy``). The forward runs
    without checkpointing (its recomputation would hide the saves from the hooks); what checkpointing keeps is derived
    from where each save happened and what each block was given."""
    blocks = dit.blocks()
    policy = AutocastPolicy(*autocast) if autocast else contextlib.nullcontext()
    parameters = {tensor.untyped_storage()._cdata for tensor in dit.parameters()}
    saved, given = set(parameters), set(parameters)
    inside, given_first = [0] * len(blocks), [0] * len(blocks)
    outside = 0
    current: list[int] = []

    def new_bytes(tensor: torch.Tensor, seen: set[int]) -> int:
        storage = tensor.untyped_storage()
        if storage._cdata in seen or (autocast and storage._cdata in policy.weight_casts):
            return 0
        seen.add(storage._cdata)
        return storage.nbytes()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal outside
        size = new_bytes(tensor, saved)
        if current:
            inside[current[-1]] += size
        else:
            outside += size
        return tensor

    def enter(index: int):
        def hook(module, args, kwargs) -> None:
            tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
            given_first[index] += sum(new_bytes(tensor, given) for tensor in tensors if tensor.is_floating_point())
            current.append(index)

        return hook

    def leave(*_) -> None:
        current.pop()

    handles = [block.register_forward_pre_hook(enter(i), with_kwargs=True) for i, block in enumerate(blocks)]
    handles += [block.register_forward_hook(leave) for block in blocks]
    if getattr(dit.transformer, "is_gradient_checkpointing", False):
        dit.transformer.disable_gradient_checkpointing()
    try:
        with _FusedAttention(), policy, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            dit(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return Activations(outside, tuple(inside), tuple(given_first))
