"""Mixed precision per device: bf16 where the GPU has it, fp16 (with accelerate's grad scaler) on older GPUs,
fp32 on CPU and MPS, where bf16 autocast is slower than fp32 — unless the launcher chose one. fp16 in CPU processes
is refused: accelerate has neither its autocast nor its grad scaler there.

``accelerate launch --mixed_precision bf16`` (or a launch config's ``mixed_precision``) reaches the processes as
``ACCELERATE_MIXED_PRECISION``: ``trainer.mixed_precision=auto`` follows a half precision named there, as a script
built on accelerate would. The launcher also writes ``no`` there when it was given nothing, so a ``no`` cannot be
told from no choice at all and leaves ``auto`` to the device; ``trainer.mixed_precision=no`` asks for fp32."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from dit_trainer.errors import ConfigError

LAUNCHER_PRECISION = "ACCELERATE_MIXED_PRECISION"
HALF_PRECISIONS = ("bf16", "fp16")


@dataclass(frozen=True)
class Precision:
    """The precision a run trains in (``no`` | ``fp16`` | ``bf16``, as accelerate names them) and why: the start
    banner says both."""

    value: str
    reason: str

    def describe(self) -> str:
        return f"{'fp32' if self.value == 'no' else self.value} ({self.reason})"


def choose_mixed_precision(requested: str) -> Precision:
    """``trainer.mixed_precision`` resolved for this launch and machine: an explicit choice stands (it overrides the
    launcher's), ``auto`` takes the launcher's half precision, else the device's best."""
    launched = os.environ.get(LAUNCHER_PRECISION, "").strip().lower()
    if requested != "auto":
        overridden = launched not in ("", "no", requested)
        note = f"; it overrides the launcher's {launched} ({LAUNCHER_PRECISION})" if overridden else ""
        return Precision(requested, f"trainer.mixed_precision={requested}{note}{_slow_on_cpu(requested)}")
    if launched in HALF_PRECISIONS:
        return Precision(launched, f"auto: the launcher's --mixed_precision {launched}{_slow_on_cpu(launched)}")
    if launched not in ("", "no"):
        raise ConfigError(
            LAUNCHER_PRECISION,
            launched,
            f"this trainer trains in fp32 (`no`), {' or '.join(HALF_PRECISIONS)}, and `trainer.mixed_precision=auto` "
            "follows the launcher's choice",
            "launch with `--mixed_precision bf16` (or fp16, or no), or set `trainer.mixed_precision` explicitly",
        )
    if torch.cuda.is_available():
        if torch.cuda.is_bf16_supported():
            return Precision("bf16", "auto: this GPU has bf16")
        return Precision("fp16", "auto: this GPU has no bf16; fp16 with a grad scaler")
    return Precision("no", "auto: no CUDA GPU, and bf16 autocast is slower than fp32 on a CPU")


def refuse_fp16_without_autocast(requested: str, resolved: str, autocasts: bool) -> None:
    """fp16 (``resolved`` from ``trainer.mixed_precision=requested``) where accelerate runs no fp16 autocast
    (``autocasts`` false: CPU processes, on a machine without a GPU or launched with ``ACCELERATE_USE_CPU=1``): the
    DiT would train in fp32 without a grad scaler while the frozen encoders ran in fp16, several times slower."""
    if resolved != "fp16" or autocasts:
        return
    raise ConfigError(
        "trainer.mixed_precision" if requested != "auto" else LAUNCHER_PRECISION,
        "fp16",
        "this run's processes are on the CPU, where accelerate has neither an fp16 autocast nor a grad scaler (the "
        "DiT would train in fp32 and only the frozen encoders run in fp16, several times slower)",
        "use `trainer.mixed_precision=no` (fp32, the fastest on a CPU) or `bf16`, or launch on GPUs",
    )


def _slow_on_cpu(value: str) -> str:
    on_cpu = value == "bf16" and not torch.cuda.is_available()
    return "; on a CPU, 1.3-1.5x slower than fp32" if on_cpu else ""


def resolve_mixed_precision(requested: str) -> str:
    """``auto`` -> ``bf16`` | ``fp16`` | ``no`` for this launch and machine; explicit choices pass through."""
    return choose_mixed_precision(requested).value


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
