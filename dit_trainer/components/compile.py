"""Regional compilation (``trainer.compile``): each repeated transformer block compiled in place, as accelerate's
regional compilation and torchtitan do, instead of the whole model. What is compiled is the block's ``forward``:
``nn.Module.compile`` would also trace the module's hooks (FSDP2's all-gathers among them) into the graph.

The blocks share one forward, so dynamo traces it once and every block reuses the graph (its parameters are graph
inputs): the compile costs one block's, not the whole model's. Everything around the blocks (patch and timestep
embeddings, the final layer, the family's glue in ``predict``) stays eager, so the adapter, the samplers, gradient
checkpointing, LoRA and the checkpoint hooks see the same modules and state-dict keys as without compilation.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import nn

from dit_trainer.components.dit import DiTAdapter
from dit_trainer.errors import ConfigError


def compile_blocks(dit: DiTAdapter, dynamic: bool | None = None) -> int:
    """Compile the ``forward`` of every block of ``dit`` (one compiled function, bound to each block: a deep copy,
    such as GRPO's frozen reference, rebinds it to the copy's own weights); returns how many blocks. The module's
    hooks (FSDP2's gathers, and ``_contiguous_inputs``) stay eager around it, and the parameters and state-dict
    keys are unchanged. ``dynamic``: ``torch.compile``'s (None: static first, dynamic once a shape changes)."""
    blocks = dit.blocks()
    compiled: dict[type, Callable] = {}
    for block in blocks:
        cls = type(block)
        if cls not in compiled:
            compiled[cls] = torch.compile(cls.forward, dynamic=dynamic)
        block.forward = types.MethodType(compiled[cls], block)
        block.register_forward_pre_hook(_contiguous_inputs, with_kwargs=True)
    return len(blocks)


def _contiguous_inputs(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A graph is guarded on its inputs' strides: the first block gets the patch embedding's transposed output and
    the others a block's contiguous one, which would compile every graph twice. A no-op copy for the others."""

    def contiguous(value):
        return value.contiguous() if isinstance(value, torch.Tensor) else value

    return tuple(map(contiguous, args)), {key: contiguous(value) for key, value in kwargs.items()}


def apply_compile(dit: DiTAdapter, enabled: bool, bucketed: bool) -> None:
    """``trainer.compile`` (``enabled``): compile the blocks before ``accelerator.prepare`` wraps the model
    (torchtitan's order).

    Recompiles: a graph is guarded on its input shapes and on grad mode. With one latent shape, one graph trains and
    one samples for the monitors (no grad); a monitor with another batch adds one whose batch is dynamic. Each bucket
    of ``data.buckets`` (``bucketed``) is another token count, so there the blocks compile for dynamic shapes at
    once: on the CPU, one graph served three bucket shapes, where the default compiled a static graph and recompiled
    at the second bucket. Either way torch's limit of 8 recompiles per function is not reached."""
    if not enabled:
        return
    if not dit.blocks():
        raise ConfigError(
            "trainer.compile",
            True,
            f"{type(dit.transformer).__name__} has none of the block lists its family names "
            f"({', '.join(dit.family.blocks)}), and regional compilation compiles those blocks",
            "name the transformer's ModuleLists of blocks in the family's `blocks`, or set `trainer.compile=false`",
        )
    compile_blocks(dit, dynamic=True if bucketed else None)
