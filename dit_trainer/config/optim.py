"""The optimizer section (``optim``): which optimizer (``training/optimizers.py`` builds and checks it), its
learning rate and LR schedule, and gradient clipping."""

from __future__ import annotations

from dataclasses import dataclass

from dit_trainer.config.choices import OPTIMIZERS
from dit_trainer.config.fields import at_least, finite, fraction, one_of, positive


@dataclass
class OptimConfig:
    """The optimizer (fused AdamW by default) with a diffusers LR schedule, and gradient clipping."""

    # adamw: torch's fused AdamW | adamw8bit: bitsandbytes' AdamW8bit (`pip install bitsandbytes`) | adafactor:
    # torch.optim.Adafactor (lr is a relative step, torch's default 1e-2; betas and eps unused) | prodigy: prodigyopt's
    # Prodigy (`pip install prodigyopt`), which estimates the step size itself: set optim.lr=1.0 and tune d_coef
    name: str = one_of(OPTIMIZERS, "adamw")
    lr: float = finite(0, 1e-4, "set e.g. `optim.lr=1e-4`", above=True)
    weight_decay: float = finite(0, 0.0, "set e.g. `optim.weight_decay=0.01`")
    beta1: float = fraction(0.9)
    beta2: float = fraction(0.999)
    # Adam's term beside the gradient's RMS in the denominator: 0 divides by zero where a gradient is 0
    eps: float = finite(0, 1e-8, "set e.g. `optim.eps=1e-8`", above=True)
    warmup_steps: int = at_least(0, 500)
    # A diffusers LR schedule (diffusers.optimization)
    lr_schedule: str = one_of(
        ("constant_with_warmup", "constant", "linear", "cosine", "cosine_with_restarts", "polynomial"),
        "constant_with_warmup",
    )
    max_grad_norm: float = at_least(0, 1.0, "set e.g. `optim.max_grad_norm=1.0`", note="0 disables clipping")
    # Prodigy only: scales the step size it estimates (its preferred knob: 0.5 smaller, 2 larger)
    d_coef: float = positive(1.0, "set e.g. `optim.d_coef=1.0`")
