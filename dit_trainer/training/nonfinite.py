"""The non-finite policy: a step whose loss or gradients are NaN/inf on any process is skipped and counted, and
``trainer.max_consecutive_nonfinite`` of them in a row stop the run with a report of what went wrong and how to fix
it (earlier checkpoints stay intact).

fp16's grad scaler overflows are not such steps: a finite loss whose scaled gradients overflowed is the scaler's
normal search for its scale (from 2^16 it halves on each overflow, and a run's first steps overflow by design). The
scaler skips the step and lowers its scale itself; the guard counts it in ``scaler_overflows`` only, unless the
scale has fallen below 1, where the gradients overflow unscaled and the step is non-finite like any other."""

from __future__ import annotations

from collections.abc import Callable

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from torch import nn

from dit_trainer.config import OptimConfig, PrivacyConfig
from dit_trainer.errors import NonFiniteError
from dit_trainer.sharding import local
from dit_trainer.training.preemption import PreemptionHandler
from dit_trainer.training.state.training_state import TrainingState

logger = get_logger(__name__)
SHOWN = 6


def nonfinite_advice(optim: OptimConfig, privacy: PrivacyConfig, mixed_precision: str) -> list[str]:
    """The fixes a report of non-finite steps suggests, in the run's config."""
    lr = optim.lr
    advice = [f"lower the learning rate (`optim.lr={lr:g}` -> e.g. `optim.lr={lr / 10:g}`)"]
    if mixed_precision == "fp16":
        advice.append("train in bf16 (`trainer.mixed_precision=bf16`), whose range does not overflow")
    if not optim.max_grad_norm and not privacy.enabled:  # under DP, Opacus clips every sample
        advice.append("clip gradients (`optim.max_grad_norm=1.0`)")
    return advice


class NonFiniteGuard:
    """``check(loss, grad_norm)`` once per step, on every process (one device sync; one more on an fp16 overflow,
    to read the scale). While the trainer runs, its ``preemption`` flag rides along in the same collective, so that
    every process learns whether any was signalled to stop without a second all-reduce per step
    (``stop_agreed``).

    ``advice`` are the fixes the report suggests, phrased in the run's config (``lower the learning rate ...``);
    ``current_lr`` reads the learning rate of the last step for the report.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: nn.Module,
        state: TrainingState,
        max_consecutive: int,
        advice: list[str],
        current_lr: Callable[[], float],
    ) -> None:
        self.accelerator = accelerator
        self.model = model
        self.state = state
        self.max_consecutive = max_consecutive
        self.advice = advice
        self.current_lr = current_lr
        self.consecutive = 0
        self.preemption: PreemptionHandler | None = None
        self.stop_agreed: bool | None = None  # set by each check; None until then

    def check(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """Whether this step's loss and the gradient it would apply (``grad_norm``: their total norm) are finite on
        every process. A non-finite step is counted in ``state.skipped_steps``; too many in a row raise
        ``NonFiniteError``."""
        signalled = self.preemption is not None and self.preemption.requested is not None
        # torch.full fills on the device: no host-to-device copy (itself a sync) for the flag
        stop = torch.full((), signalled, dtype=torch.bool, device=loss.device)
        flags = torch.stack([~torch.isfinite(loss), ~torch.isfinite(grad_norm).to(loss.device), stop]).float()
        if self.accelerator.num_processes > 1:
            flags = self.accelerator.reduce(flags, reduction="sum")
        bad_loss, bad_gradients, stop_votes = flags.tolist()
        self.stop_agreed = stop_votes > 0
        if not (bad_loss or bad_gradients):
            self.consecutive = 0
            return True
        if not bad_loss and self.scaler_recovers():
            self.state.scaler_overflows += 1
            return False
        self.state.skipped_steps += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteError(self.report(loss, grad_norm))
        logger.warning(
            f"step {self.state.step + 1}: non-finite loss ({loss.item():.4g}) or gradient norm "
            f"({grad_norm.item():.4g}); the update is skipped"
        )
        return False

    def scaler_recovers(self) -> bool:
        """Whether fp16's grad scaler, lowering its scale, will find one whose gradients are finite."""
        scaler = self.accelerator.scaler
        return scaler is not None and scaler.get_scale() >= 1.0

    def report(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> str:
        model = self.accelerator.unwrap_model(self.model)
        grads = [(n, local(p.grad)) for n, p in model.named_parameters() if p.grad is not None]  # FSDP: this slice
        bad = [name for name, grad in grads if not torch.isfinite(grad).all()]
        more = f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        shown = ", ".join(bad[:SHOWN]) + more if bad else "none"
        return (
            f"Training stopped at step {self.state.step + 1}: the loss or the gradients were NaN/inf for "
            f"{self.consecutive} consecutive steps (`trainer.max_consecutive_nonfinite={self.max_consecutive}`), and "
            f"each of those updates was skipped. Last step: loss {loss.item():.4g}, gradient norm "
            f"{grad_norm.item():.4g}, lr {self.current_lr():.4g}. Parameters with non-finite gradients: {shown}. "
            f"To fix it, {'; or '.join(self.advice)}. Checkpoints written so far are intact; "
            "`trainer.resume=latest` continues from the newest."
        )
