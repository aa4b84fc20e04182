"""Autocast's casts, replayed on the meta device, where ``torch.autocast`` does nothing: the memory estimate measures
the activations a run keeps for backward, and under mixed precision those are autocast's, not those of a model cast
to bf16. A linear layer saves the bf16 copy of its input that autocast made (three copies when q, k and v project
one normalised input), CUDA runs layer norm and softmax in float32 and keeps their float32 outputs, and the residual
stream stays float32: measured on DiT-XL/2, the cast model's count was 1.30x too low, so batches it admitted ran out
of memory. The op lists are torch's autocast lists (torch.amp docs) for the ops a DiT runs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

# Ops autocast runs in the lower precision, on CUDA and on the CPU alike.
LOWER_PRECISION = frozenset({
    "linear", "matmul", "__matmul__", "mm", "bmm", "addmm", "baddbmm", "addbmm", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "scaled_dot_product_attention", "prelu",
})  # fmt: skip
# Ops CUDA's autocast runs in float32 (the CPU's list holds none of a DiT's: its norms keep their input's dtype).
FLOAT32 = {
    "cuda": frozenset({
        "layer_norm", "group_norm", "softmax", "log_softmax", "pow", "__pow__", "__rpow__", "rsqrt", "exp", "expm1",
        "log", "log1p", "log2", "log10", "norm", "normalize", "sum", "cumsum", "cumprod", "reciprocal", "softplus",
        "mse_loss", "l1_loss", "smooth_l1_loss", "cross_entropy", "nll_loss", "prod", "erfinv", "cosine_similarity",
        "cdist", "acos", "asin", "cosh", "sinh", "tan", "__rtruediv__", "__rdiv__",
    }),
    "cpu": frozenset(),
}  # fmt: skip


class AutocastPolicy(TorchFunctionMode):
    """``torch.autocast(device_type, dtype)``'s casts on tensors of any device (the meta device's included). The
    casts of parameters are noted in ``weight_casts`` (storage ids): autocast makes them once per step, whatever the
    batch, so they count as weights, not as activations."""

    def __init__(self, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype, self.float32 = dtype, FLOAT32.get(device_type, frozenset())
        self.weight_casts: set[int] = set()
        self._casts: dict[int, torch.Tensor] = {}  # a parameter's id -> its cast, made once as autocast caches it

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in LOWER_PRECISION:
            args, kwargs = tree_map(lambda value: self._cast(value, self.dtype), (args, kwargs or {}))
        elif name in self.float32:
            args, kwargs = tree_map(lambda value: self._cast(value, torch.float32), (args, kwargs or {}))
        return func(*args, **(kwargs or {}))

    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dtype == dtype:
            return value
        if not isinstance(value, nn.Parameter):
            return value.to(dtype)
        if id(value) not in self._casts:
            cast = self._casts[id(value)] = value.to(dtype)
            self.weight_casts.add(cast.untyped_storage()._cdata)
        return self._casts[id(value)]
