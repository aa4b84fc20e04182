"""What the rest of the package needs to know about sharded (FSDP2) weights, in one place.

FSDP2 (``fully_shard``) replaces each parameter with a ``DTensor`` of which every process holds one slice. Code
that reads whole weights (a norm, a ``save_pretrained`` folder) gathers them here; everything else works on the
slices unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def is_sharded(parameters: Iterable[torch.Tensor]) -> bool:
    """Whether ``parameters`` (e.g. ``module.parameters()``) are FSDP2 slices: then whole-weight reads are
    collective."""
    return any(isinstance(parameter, DTensor) for parameter in parameters)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself, or the whole value of a ``DTensor`` (a collective: every process must call it)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's slice of a ``DTensor`` (``tensor`` itself otherwise): to inspect it without a collective."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def gathered_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict of a sharded ``module`` on the CPU of process 0, empty elsewhere. A collective: every
    process calls it, so the main process can write the weights without any process holding them on its device."""
    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def reshard(module: nn.Module) -> None:
    """Put every FSDP2 unit of ``module`` back into its sharded state. The root unit stays gathered after a forward
    without a backward (a monitor's sampling), and its parameters are then plain tensors: code that reads or swaps
    the sharded parameters (the EMA, checkpoints) calls this first."""
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()
