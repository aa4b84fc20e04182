"""Freezing: what it means here, in one place."""

from __future__ import annotations

from torch import nn


def freeze(module: nn.Module) -> nn.Module:
    """Make ``module`` a frozen feature extractor: no parameter requires grad, dropout and friends off.

    ``eval()`` is for behaviour (dropout, norm statistics), not for gradients: it is ``requires_grad_(False)`` that
    keeps the module out of the graph, and callers also run it under ``torch.no_grad()`` to save activations.
    """
    module.requires_grad_(False)
    return module.eval()


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters that train, in a fixed order: what the optimizer, EMA and checkpoints all work on."""
    return [parameter for parameter in module.parameters() if parameter.requires_grad]
