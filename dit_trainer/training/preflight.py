"""Before the first step: the gradient-flow doctor on the real loss. A problem becomes a ``GradientFlowError`` that
explains its cause (rather than PyTorch's "does not require grad" from deep inside backward)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dit_trainer.diagnostics import diagnose_gradient_flow
from dit_trainer.errors import GradientFlowError

# What a finding means in this trainer's config, appended to the doctor's generic advice.
CONFIG_HINTS = {
    "reentrant_checkpoint": "In this trainer: set `trainer.reentrant_checkpointing=false`.",
    "no_trainable_params": "In this trainer only the VAE and the text encoder are frozen (and the base under LoRA).",
}


def preflight(dit: nn.Module, compute_loss: Callable[[], torch.Tensor]) -> None:
    """Raise ``GradientFlowError`` when ``compute_loss()`` cannot train ``dit``."""
    # Eager even under `trainer.compile`: the doctor records every op through a torch-function mode, which compiled
    # blocks would recompile for at each depth of its stack (dozens of graphs for one diagnostic pass).
    with torch.compiler.set_stance("force_eager"):
        report = diagnose_gradient_flow(dit, compute_loss)
    if not report.ok:
        hints = [CONFIG_HINTS[code] for code in report.codes if code in CONFIG_HINTS]
        raise GradientFlowError("\n".join([str(report), *hints]))
