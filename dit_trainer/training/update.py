"""How a step's gradients become an optimizer update, behind one interface the trainer's single step path uses.

``AccelerateUpdate`` is the usual one: accelerate's gradient accumulation and fp16 loss scaling, the total norm
taken before the step, clipping to ``optim.max_grad_norm``. ``PrivateUpdate`` is DP-SGD: Opacus back-propagates
the (B,) loss so that each sample's gradient is clipped, the DP optimizer adds noise, and the norm is that of the
noised gradient it applies. Either way the norm is taken before the parameters change, so the non-finite guard
sees the gradient that would be applied and can skip it.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod

import torch
from accelerate import Accelerator
from torch import nn

from dit_trainer.config import OptimConfig, TrainerConfig
from dit_trainer.sharding import whole
from dit_trainer.training.parallel.privacy import PrivateTraining


def total_norm(parameters: list[nn.Parameter]) -> torch.Tensor:
    """The norm of all gradients of ``parameters`` together (parameters without a gradient count as zero); of the
    whole gradient when it is sharded (FSDP2: each process holds a slice, and the norm of the slices is reduced)."""
    return whole(torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None]))


class Update(ABC):
    """One optimizer step over ``micro_batches`` backward passes of the parameters that train."""

    micro_batches = 1

    def __init__(self, optimizer: torch.optim.Optimizer, lr_scheduler, parameters: list[nn.Parameter]) -> None:
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.parameters = parameters

    def accumulate(self) -> contextlib.AbstractContextManager:
        """The context of one micro-batch's forward and backward."""
        return contextlib.nullcontext()

    @property
    def sync_gradients(self) -> bool:
        """Whether this micro-batch completes the step's gradients (time to update)."""
        return True

    @abstractmethod
    def backward(self, per_sample_loss: torch.Tensor) -> torch.Tensor:
        """Back-propagate the (B,) loss; returns its mean, detached."""

    def backward_empty(self) -> torch.Tensor:
        """A batch without samples (only Poisson sampling draws them); returns the loss to log."""
        raise RuntimeError(f"{type(self).__name__} takes no empty batches")

    @abstractmethod
    def norm_before_step(self) -> torch.Tensor:
        """The total norm of the gradient the step would apply (the guard skips the step when it is not finite)."""

    @abstractmethod
    def step(self, grad_norm: torch.Tensor, finite: bool) -> torch.Tensor:
        """Apply the update if ``finite`` and clear the gradients; returns the gradient norm to log."""

    def diagnostics_paused(self) -> contextlib.AbstractContextManager:
        """A context in which a diagnostic backward (the preflight) leaves no trace in the update's state."""
        return contextlib.nullcontext()

    def metrics(self) -> dict[str, float]:
        """What the update adds to each log line."""
        return {}

    def current_lr(self) -> float:
        return self.lr_scheduler.get_last_lr()[0]


class AccelerateUpdate(Update):
    """Accelerate's accumulation and loss scaling, then clipping to ``max_grad_norm`` (0: off)."""

    def __init__(
        self,
        accelerator: Accelerator,
        dit: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler,
        parameters: list[nn.Parameter],
        max_grad_norm: float,
        micro_batches: int,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, parameters)
        self.accelerator = accelerator
        self.dit = dit
        self.max_grad_norm = max_grad_norm
        self.micro_batches = micro_batches  # accelerate's gradient_accumulation_steps: it syncs on the last one

    def accumulate(self) -> contextlib.AbstractContextManager:
        return self.accelerator.accumulate(self.dit)

    @property
    def sync_gradients(self) -> bool:
        return self.accelerator.sync_gradients

    def backward(self, per_sample_loss: torch.Tensor) -> torch.Tensor:
        loss = per_sample_loss.mean()
        self.accelerator.backward(loss)
        return loss.detach()

    def norm_before_step(self) -> torch.Tensor:
        """The total norm of the (fp16: unscaled) gradients."""
        self.accelerator.unscale_gradients()
        return total_norm(self.parameters)

    def step(self, grad_norm: torch.Tensor, finite: bool) -> torch.Tensor:
        if finite:
            self._clip(grad_norm)
        # fp16's grad scaler must see the step to skip it and lower its scale itself.
        if finite or self.accelerator.scaler is not None:
            self.optimizer.step()
            if not self.optimizer.step_was_skipped:  # the schedule counts the updates applied (fp16: not skipped)
                self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _clip(self, grad_norm: torch.Tensor) -> None:
        """Scale the gradients down to ``max_grad_norm`` when their norm is above it.

        What ``accelerator.clip_grad_norm_`` does for the models this trainer prepares (one process, DDP, FSDP2: the
        norm is the whole gradient's, and each slice is scaled by it), without walking the module for its parameters
        and rescaling every gradient even when the norm is under the limit. The comparison reads the norm that the
        finite check has just synchronised, so it adds no device sync.
        """
        if self.max_grad_norm and grad_norm.item() > self.max_grad_norm:
            torch.nn.utils.clip_grads_with_norm_(self.parameters, self.max_grad_norm, grad_norm)


class PrivateUpdate(Update):
    """DP-SGD on one Poisson-sampled batch per step: Opacus clips each sample's gradient to
    ``privacy.max_grad_norm`` (``optim.max_grad_norm`` is not applied) and adds noise."""

    def __init__(
        self,
        privacy: PrivateTraining,
        device: torch.device,
        optimizer: torch.optim.Optimizer,
        lr_scheduler,
        parameters: list[nn.Parameter],
    ) -> None:
        super().__init__(optimizer, lr_scheduler, parameters)
        self.privacy = privacy
        self.device = device

    def backward(self, per_sample_loss: torch.Tensor) -> torch.Tensor:
        loss = per_sample_loss.detach().mean()
        self.privacy.backward(per_sample_loss)
        return loss

    def backward_empty(self) -> torch.Tensor:
        """No image drawn: the step still adds noise (to a zero gradient), as the accounting assumes."""
        self.privacy.backward_empty()
        return torch.tensor(0.0, device=self.device)

    def norm_before_step(self) -> torch.Tensor:
        """The norm of the clipped and noised gradient (as private as the weights it updates). Clipping does not make
        a non-finite per-sample gradient finite (0 x inf is NaN), so this is what the guard must see."""
        self.privacy.noise_gradient()
        return total_norm(self.parameters)

    def step(self, grad_norm: torch.Tensor, finite: bool) -> torch.Tensor:
        if finite:
            self.privacy.apply_gradient()
            self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def diagnostics_paused(self) -> contextlib.AbstractContextManager:
        return self.privacy.hooks_paused()

    def metrics(self) -> dict[str, float]:
        return {"privacy/epsilon": self.privacy.epsilon()}


def build_update(
    trainer: TrainerConfig,
    optim: OptimConfig,
    accelerator: Accelerator,
    dit: nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler,
    parameters: list[nn.Parameter],
    privacy: PrivateTraining | None,
) -> Update:
    """DP-SGD under ``privacy.enabled`` (``privacy``: its training), else accelerate's accumulation over
    ``trainer.gradient_accumulation_steps`` with clipping to ``optim.max_grad_norm``."""
    if privacy is None:
        accumulation, max_norm = trainer.gradient_accumulation_steps, optim.max_grad_norm
        return AccelerateUpdate(accelerator, dit, optimizer, lr_scheduler, parameters, max_norm, accumulation)
    return PrivateUpdate(privacy, accelerator.device, optimizer, lr_scheduler, parameters)
