"""Mixed precision per device: bf16 where the GPU has it, fp16 (with accelerate's grad scaler) on older GPUs,
fp32 on CPU and MPS, where bf16 autocast is slower than fp32."""

from __future__ import annotations

import torch


def resolve_mixed_precision(requested: str) -> str:
    """``auto`` -> ``bf16`` | ``fp16`` | ``no`` for this machine; explicit choices pass through."""
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "no"


def allow_tf32(device: torch.device) -> None:
    """TF32 tensor cores for the float32 matmuls and convolutions left on a GPU (master-weight work, fp32 runs,
    the losses): ~8x faster on Ampere and later, with a 10-bit mantissa that diffusion training does not notice.
    Nothing changes on a CPU."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def weight_dtype(mixed_precision: str) -> torch.dtype:
    """The dtype for frozen components: they never see an optimizer, so half precision only saves memory."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision, torch.float32)
