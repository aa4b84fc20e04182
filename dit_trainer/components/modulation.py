"""The families' timestep modulation, arranged for per-sample gradient engines (Opacus): PixArt's adaLN-single tables
moved into modules the engine can see, and a shared embedder run once per forward.

diffusers' PixArt adds raw ``scale_shift_table`` parameters inside the forward of its blocks and of the model
itself. Per-sample gradient engines (Opacus) work module by module, from each module's inputs and output
gradients, so a parameter used inline has no per-sample gradient; Opacus' fallback refuses the model ("This
layer has buffers"). ``expose_modulation_tables`` moves each table into a small module that applies it to the
batch, and leaves a zero table in its place, so the model computes exactly what it computed before:

- a block reads ``table + timestep.reshape(B, 6, D)``; ``BlockModulation`` adds the table to the block's
  ``timestep`` argument instead (a forward pre-hook), so the per-sample gradient of the table is the gradient of
  that argument;
- the model's output layer computes ``y * (1 + e + scale) + (e + shift)`` with ``y = norm_out(h)``;
  ``OutputModulation`` adds ``y * scale + shift`` to the input of ``proj_out``.

State dicts keep diffusers' key names (``...scale_shift_table``), so ``save_pretrained``/``from_pretrained``
and checkpoints are unchanged.

The DiT calls its timestep-and-label embedder in every block and again at the output layer, on the same inputs.
Opacus' ghost clipping refuses a layer that runs twice in a forward (it cannot combine the norms of several calls),
and its hooks mode computes each call's per-sample gradient again. ``embed_once_per_forward`` makes such an embedder
compute its output at its first call in a forward of the transformer and hand the same tensor to the later calls:
the same outputs, the same summed gradient, one call for the engine to record.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers import PixArtTransformer2DModel
from torch import nn

TABLE = "scale_shift_table"


class BlockModulation(nn.Module):
    """Adds a block's (6, D) table to its (B, 6 * D) timestep embedding."""

    def __init__(self, table: nn.Parameter) -> None:
        super().__init__()
        self.table = table

    def forward(self, timestep: torch.Tensor) -> torch.Tensor:
        return timestep + self.table.flatten().to(timestep.dtype)


class OutputModulation(nn.Module):
    """Adds ``normed * scale + shift`` ((2, D) table: shift, scale) to the final projection's input."""

    def __init__(self, table: nn.Parameter) -> None:
        super().__init__()
        self.table = table
        self.normed: list[torch.Tensor] = []

    def forward(self, hidden_states: torch.Tensor, normed: torch.Tensor) -> torch.Tensor:
        shift, scale = self.table.to(hidden_states.dtype)
        return hidden_states + normed * scale + shift

    # The transformer's hooks are bound methods, not closures: a deep copy of the transformer (a meta-device copy for
    # memory estimates, GRPO's reference) then calls its own copy of this module.
    def remember_normed(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        self.normed.append(output)

    def modulate_input(self, module: nn.Module, args: tuple) -> tuple[torch.Tensor]:
        return (self(args[0], self.normed.pop()),)


def block_modulation_grad_sample(
    layer: BlockModulation, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """Per-sample gradient of the table: the gradient of each sample's modulated timestep, shaped like it."""
    return {layer.table: backprops.reshape(backprops.shape[0], *layer.table.shape)} if layer.table.requires_grad else {}


def output_modulation_grad_sample(
    layer: OutputModulation, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """Per-sample gradient of (shift, scale): the output gradient summed over tokens, and times ``normed``."""
    if not layer.table.requires_grad:
        return {}
    normed = activations[1].to(backprops.dtype)
    tokens = tuple(range(1, backprops.dim() - 1))
    return {layer.table: torch.stack([backprops.sum(tokens), (backprops * normed).sum(tokens)], dim=1)}


def _take_table(module: nn.Module) -> nn.Parameter:
    """Remove ``module``'s table parameter, leaving a zero table (not saved) that its forward still reads."""
    table = module._parameters.pop(TABLE)
    module.register_buffer(TABLE, torch.zeros_like(table, requires_grad=False), persistent=False)
    return table


def _keep_diffusers_key(module: nn.Module, owner: str) -> None:
    """``<owner>.table`` is saved and loaded under diffusers' name ``scale_shift_table``."""

    def save(module, state_dict, prefix, local_metadata) -> None:
        state_dict[prefix + TABLE] = state_dict.pop(f"{prefix}{owner}.table")

    def load(module, state_dict, prefix, *args) -> None:
        if prefix + TABLE in state_dict:
            state_dict[f"{prefix}{owner}.table"] = state_dict.pop(prefix + TABLE)

    module.register_state_dict_post_hook(save)
    module.register_load_state_dict_pre_hook(load)


def expose_modulation_tables(transformer: PixArtTransformer2DModel) -> list[str]:
    """Move every modulation table of ``transformer`` into a ``BlockModulation``/``OutputModulation`` module (in
    place; same outputs, same state dict). Returns the names of the moved tables. Gradient checkpointing must be
    off: its recomputation would apply the hooks' modules twice."""
    moved = []
    for name, block in transformer.transformer_blocks.named_children():
        if isinstance(block._parameters.get(TABLE), nn.Parameter):
            block.modulation = BlockModulation(_take_table(block))
            block.register_forward_pre_hook(_modulate_timestep, with_kwargs=True)
            _keep_diffusers_key(block, "modulation")
            moved.append(f"transformer_blocks.{name}.{TABLE}")
    if isinstance(transformer._parameters.get(TABLE), nn.Parameter):
        owner = OutputModulation(_take_table(transformer))
        transformer.output_modulation = owner
        transformer.norm_out.register_forward_hook(owner.remember_normed)
        transformer.proj_out.register_forward_pre_hook(owner.modulate_input)
        _keep_diffusers_key(transformer, "output_modulation")
        moved.append(TABLE)
    return moved


class OncePerForward:
    """Stands in for an embedder's ``forward``: the output of its first call in a forward of the transformer is
    returned to the later calls with the same inputs (the same tensors, the same other arguments). The memo is
    forgotten when the transformer's forward starts and ends, so no weights or graph outlive the forward and a
    change of weights is always seen. Bound methods, not closures: a deep copy of the transformer (the EMA, a
    meta-device copy) gets a memo of its own that calls its own copy of the embedder."""

    def __init__(self, forward: Callable[..., torch.Tensor]) -> None:
        self.compute = forward
        self.memo: tuple[tuple, dict, torch.Tensor] | None = None

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        if self.memo is not None and _same(self.memo[0], args) and _same(self.memo[1], kwargs):
            return self.memo[2]
        output = self.compute(*args, **kwargs)
        self.memo = (args, kwargs, output)
        return output

    def forget(self, *hook_args) -> None:
        self.memo = None


def _same(a: tuple | dict, b: tuple | dict) -> bool:
    """The same arguments: tensors by identity (the transformer passes its own to every call), others by value."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and _same(tuple(a.values()), tuple(b[key] for key in a))
    return len(a) == len(b) and all(x is y or (not isinstance(x, torch.Tensor) and x == y) for x, y in zip(a, b))


def embed_once_per_forward(transformer: nn.Module, embedders: list[nn.Module]) -> int:
    """Every module of ``embedders`` (duplicates counted once) computes its output once per forward of
    ``transformer``; returns how many modules that is. Gradient checkpointing must be off: its recomputation runs
    after the forward, when the memo is forgotten."""
    distinct = list({id(module): module for module in embedders}.values())
    for module in distinct:
        once = OncePerForward(module.forward)
        module.forward = once
        transformer.register_forward_pre_hook(once.forget)
        transformer.register_forward_hook(once.forget)
    return len(distinct)


def _modulate_timestep(block: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return args, {**kwargs, "timestep": block.modulation(kwargs["timestep"])}
