"""Parameter breakdown per component, and what a few optimizer steps did to each parameter."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

ADAPTER_MARKERS = ("lora_",)  # peft's LoRA parameters (lora_A, lora_B, lora_embedding_*)


@dataclass(frozen=True)
class ParameterCount:
    component: str
    trainable: int
    frozen: int
    adapter: int  # LoRA adapter parameters, a subset of ``trainable``

    @property
    def total(self) -> int:
        return self.trainable + self.frozen

    @property
    def trainable_percent(self) -> float:
        return 100 * self.trainable / max(self.total, 1)


def count_parameters(component: str, module: nn.Module) -> ParameterCount:
    trainable = frozen = adapter = 0
    for name, parameter in module.named_parameters():
        if parameter.requires_grad:
            trainable += parameter.numel()
            adapter += parameter.numel() if any(marker in name for marker in ADAPTER_MARKERS) else 0
        else:
            frozen += parameter.numel()
    return ParameterCount(component, trainable, frozen, adapter)


def format_parameter_table(counts: list[ParameterCount]) -> str:
    """An aligned text table: trainable / frozen / total / trainable % / LoRA adapters, one row per component."""
    header = ("component", "trainable", "frozen", "total", "trainable %", "LoRA adapters")
    rows = [header] + [
        (
            c.component,
            f"{c.trainable:,}",
            f"{c.frozen:,}",
            f"{c.total:,}",
            f"{c.trainable_percent:.2f}",
            f"{c.adapter:,}",
        )
        for c in counts
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def gradient_norm(module: nn.Module) -> float:
    """The L2 norm of all gradients in ``module`` (0 when none has one)."""
    grads = [p.grad.detach().float().norm() for p in module.parameters() if p.grad is not None]
    return torch.stack(grads).norm().item() if grads else 0.0


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().clone() for name, parameter in module.named_parameters()}


def zero_gradients(module: nn.Module, prefix: str = "") -> set[str]:
    """The trainable parameters of ``module`` whose gradient after a backward is exactly zero (not missing: a missing
    one is a cut graph, the doctor's to find)."""
    return {
        prefix + name
        for name, parameter in module.named_parameters()
        if parameter.requires_grad and parameter.grad is not None and not parameter.grad.any()
    }


@dataclass(frozen=True)
class StepChanges:
    """After some optimizer steps: trainable parameters that did not move (those whose gradients were exactly zero at
    every step apart: nothing reads their outputs, as SD3's last block's text queries, so they cannot train and do no
    harm), frozen ones that did."""

    unchanged_trainable: list[str]
    changed_frozen: list[str]
    zero_gradient: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unchanged_trainable and not self.changed_frozen


def step_changes(module: nn.Module, before: dict[str, torch.Tensor], prefix: str = "") -> StepChanges:
    """Compare ``module``'s parameters with a ``snapshot`` taken before the steps (bit for bit)."""
    unchanged, changed = [], []
    for name, parameter in module.named_parameters():
        moved = not torch.equal(parameter.detach(), before[name])
        if parameter.requires_grad and not moved:
            unchanged.append(prefix + name)
        elif not parameter.requires_grad and moved:
            changed.append(prefix + name)
    return StepChanges(unchanged, changed)
