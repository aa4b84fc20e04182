"""The precision section (``precision``): levers on the DiT's arithmetic beyond autocast's mixed precision
(``trainer.mixed_precision``), each one switch: FP8 training of the transformer blocks' linear layers through torchao
(``components/fp8.py`` converts and checks them)."""

from __future__ import annotations

from dataclasses import dataclass

from dit_trainer.config.choices import FP8_RECIPES
from dit_trainer.config.fields import one_of


@dataclass
class PrecisionConfig:
    """FP8 matmuls in the DiT's blocks (torchao float8 training: float32 master weights, FP8 casts with dynamic
    scales in each forward and backward), on GPUs with FP8 tensor cores (compute capability 8.9+: L4, L40S, RTX
    4090, H100, H200, B200)."""

    fp8: bool = False  # needs `pip install torchao`; the blocks' linear layers whose sizes are multiples of 16
    # tensorwise: one scale per tensor (fastest) | rowwise: one per row (closer to bf16, a little slower)
    fp8_recipe: str = one_of(FP8_RECIPES, "tensorwise")
    # FP8's casts with the matmuls emulated in higher precision: runs on any device (CPU included), slowly; to check
    # the numerics, conversion and resume of an FP8 run where no FP8 GPU is
    fp8_emulate: bool = False
