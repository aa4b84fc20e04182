"""``scripts/verify_gradients.py``: before a long run, check on one real batch that training trains what it should.

Given the configured components (built by the script as a run builds them), tabulates trainable and frozen
parameters per component, runs the gradient-flow doctor on the real loss, then takes two optimizer steps and checks
that every trainable parameter moved and every frozen one is bit-identical (two, because LoRA's B starts at zero, so
A first moves at the second step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader

from dit_trainer.components.build import Components
from dit_trainer.config import DataConfig, OptimConfig, PrivacyConfig, TrainerConfig
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.source import build_dataset
from dit_trainer.diagnostics import GradientReport, diagnose_gradient_flow
from dit_trainer.diagnostics.parameters import (
    ParameterCount,
    StepChanges,
    count_parameters,
    format_parameter_table,
    gradient_norm,
    snapshot,
    step_changes,
    zero_gradients,
)
from dit_trainer.diffusion.loss import DiffusionLoss
from dit_trainer.training.optim import build_optimizer
from dit_trainer.training.parallel.privacy import coverage_report, without_per_sample_gradients

TRAINED = "dit"
VERIFY_BATCH_SIZE = 8  # enough for every code path; small enough for any machine


@dataclass
class VerificationReport:
    counts: list[ParameterCount]
    warnings: list[str]
    gradient_flow: GradientReport
    gradient_norms: dict[str, float] = field(default_factory=dict)  # per component, at the first step
    privacy: list[str] = field(default_factory=list)  # with privacy.enabled: per-sample gradient coverage
    changes: StepChanges | None = None  # None when the doctor found a problem and no step was taken

    @property
    def ok(self) -> bool:
        return not self.warnings and self.gradient_flow.ok and self.changes is not None and self.changes.ok

    def __str__(self) -> str:
        lines = ["Parameters", format_parameter_table(self.counts), ""]
        lines += [f"warning: {warning}" for warning in self.warnings]
        lines += ["Gradient flow", str(self.gradient_flow), ""]
        lines += [*self.privacy, ""] if self.privacy else []
        if self.gradient_norms:
            norms = ", ".join(f"{name} {norm:.4g}" for name, norm in self.gradient_norms.items())
            lines.append(f"Gradient norms at the first step: {norms}")
        if self.changes is not None:
            lines.append("After 2 optimizer steps:")
            lines.append(_listing("trainable parameters that did not change", self.changes.unchanged_trainable))
            lines.append(_listing("frozen parameters that changed", self.changes.changed_frozen))
            if self.changes.zero_gradient:
                lines.append(
                    _listing(
                        "trainable parameters whose gradients were exactly zero at every step (nothing reads their "
                        "outputs: they cannot train, and do no harm)",
                        self.changes.zero_gradient,
                    )
                )
        lines.append("OK: training trains the DiT and nothing else." if self.ok else "FAILED: see above.")
        return "\n".join(lines)


def _listing(what: str, names: list[str], shown: int = 8) -> str:
    if not names:
        return f"  {what}: none"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"  {what}: {', '.join(names[:shown])}{more}"


def verify_training_setup(
    parts: Components,
    data: DataConfig,
    trainer: TrainerConfig,
    privacy: PrivacyConfig,
    optim: OptimConfig,
    device: torch.device,
) -> VerificationReport:
    """The report on ``parts`` (on ``device``) trained on one batch of ``data`` by ``optim``'s optimizer."""
    components = {TRAINED: parts.dit, "vae": parts.vae, "text_encoder": parts.text_encoder}
    counts = [count_parameters(name, module) for name, module in components.items()]
    warnings = [
        f"the {c.component} should be frozen but has {c.trainable:,} trainable parameters: it would train (or, "
        "without a gradient, sit in the optimizer) although it runs under no_grad"
        for c in counts
        if c.component != TRAINED and c.trainable
    ]
    loader = DataLoader(build_dataset(data), batch_size=VERIFY_BATCH_SIZE, collate_fn=collate_batch)
    batch = next(iter(loader))
    generator = torch.Generator(device).manual_seed(trainer.seed)
    loss_fn = DiffusionLoss(parts.vae, parts.text_encoder, parts.schedule, data.caption_dropout)

    def compute_loss() -> torch.Tensor:
        return loss_fn(batch, parts.dit, generator)[0].mean()

    if privacy.enabled and without_per_sample_gradients(parts.dit):
        warnings.append("some trainable parameters get no per-sample gradient: DP training would refuse this DiT")
    report = VerificationReport(counts, warnings, diagnose_gradient_flow(parts.dit, compute_loss))
    if privacy.enabled:
        report.privacy = coverage_report(parts.dit)
    if not report.gradient_flow.ok:
        return report
    before = {name: snapshot(module) for name, module in components.items()}
    optimizer = build_optimizer(optim, parts.dit)
    always_zero: set[str] | None = None  # trainable parameters whose gradient was exactly zero at every step
    for step in range(2):
        compute_loss().backward()
        if step == 0:
            report.gradient_norms = {name: gradient_norm(module) for name, module in components.items()}
        zero = set().union(*(zero_gradients(module, f"{name}.") for name, module in components.items()))
        always_zero = zero if always_zero is None else always_zero & zero
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    found = [step_changes(module, before[name], prefix=f"{name}.") for name, module in components.items()]
    unchanged = [n for change in found for n in change.unchanged_trainable]
    report.changes = StepChanges(
        [n for n in unchanged if n not in always_zero],
        [n for change in found for n in change.changed_frozen],
        [n for n in unchanged if n in always_zero],
    )
    return report
