"""Before the first step: the gradient-flow doctor on the real loss. A problem becomes a ``GradientFlowError`` that
explains its cause (rather than PyTorch's "does not require grad" from deep inside backward)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dit_trainer.diagnostics import diagnose_gradient_flow
from dit_trainer.errors import GradientFlowError

# How many rows of its step's batch the doctor runs on. What it finds lies in the graph, not in the batch size; on a
# whole batch its eager pass set the run's peak memory under `trainer.compile` (DiT-XL/2 compiled at batch 256 on an
# H200: 110.5 GiB, and 80.2 with the doctor on 2 rows, at the same speed).
PREFLIGHT_ROWS = 2

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
