"""``trainer.fused_qkv``: each block's query, key and value projections run as one matmul, where diffusers' fused
attention processor can take them (``FusedAttnProcessor2_0``: the attention of PixArt's and DiT's blocks). One wide
GEMM instead of three narrow ones, and under autocast one bf16 copy of the normalised input instead of three.

diffusers' own ``fuse_qkv_projections`` is for inference: it copies the three weights into a new layer, so training
would update the copy while checkpoints, LoRA targets and exports keep reading the originals. Here the fused layer
owns no weights: it concatenates the three layers' own in each forward (a copy of 3 d^2 numbers per block, small
beside the batch's matmul), so the parameters, their names and gradients, the EMA and every checkpoint are those of
the unfused model, and turning the switch off or on between runs changes nothing that is saved."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention, AttnProcessor2_0, FusedAttnProcessor2_0
from torch import nn

from dit_trainer.components.dit import DiTAdapter
from dit_trainer.config import LoRAConfig, ModelConfig, PrecisionConfig, PrivacyConfig, TrainerConfig
from dit_trainer.errors import ConfigError, require


class FusedProjection(nn.Module):
    """The projections ``linears`` (same input, same bias setting) as one matmul over their concatenated weights,
    outputs side by side. The layers are held in a tuple, not as submodules, so their parameters are listed once."""

    def __init__(self, *linears: nn.Linear) -> None:
        super().__init__()
        self.linears = tuple(linears)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = torch.cat([linear.weight for linear in self.linears])
        has_bias = self.linears[0].bias is not None
        bias = torch.cat([linear.bias for linear in self.linears]) if has_bias else None
        return F.linear(hidden_states, weight, bias)


def fuse_qkv(dit: DiTAdapter) -> int:
    """Fuse the projections of every attention in ``dit``'s blocks that runs diffusers' standard processor
    (self-attention: q, k and v; cross-attention: k and v, q reads another input); returns how many."""
    fused = 0
    for block in dit.blocks():
        for attention in block.modules():
            if not isinstance(attention, Attention) or type(attention.processor) is not AttnProcessor2_0:
                continue
            if attention.is_cross_attention:
                attention.to_kv = FusedProjection(attention.to_k, attention.to_v)
            else:
                attention.to_qkv = FusedProjection(attention.to_q, attention.to_k, attention.to_v)
            attention.set_processor(FusedAttnProcessor2_0())
            fused += 1
    return fused


def check_fused_qkv(
    lora: LoRAConfig, privacy: PrivacyConfig, precision: PrecisionConfig, trainer: TrainerConfig
) -> None:
    """Refuse ``trainer.fused_qkv`` where the fused matmul would bypass the layers that train or are watched."""
    if not trainer.fused_qkv:
        return
    for key, on, why in (
        ("lora.enabled", lora.enabled, "LoRA's adapters wrap each projection, which the fused matmul bypasses"),
        ("privacy.enabled", privacy.enabled, "Opacus computes per-sample gradients from each projection's hooks"),
        ("precision.fp8", precision.fp8, "FP8 converts each projection, which the fused matmul bypasses"),
    ):
        require(not on, "trainer.fused_qkv", True, f"`{key}` is set, and {why}", "set `trainer.fused_qkv=false`")


def apply_fused_qkv(model: ModelConfig, trainer: TrainerConfig, dit: DiTAdapter) -> None:
    """``trainer.fused_qkv``: fuse, or refuse a model none of whose attention diffusers' fused processor takes."""
    if trainer.fused_qkv and not fuse_qkv(dit):
        processors = sorted({type(module.processor).__name__ for module in dit.transformer.modules()
                             if hasattr(module, "processor")})  # fmt: skip
        raise ConfigError(
            "trainer.fused_qkv",
            True,
            f"`model.family={model.family}`'s attention runs {', '.join(processors) or 'no diffusers processor'}, "
            "which diffusers' fused processor does not replace (it takes PixArt's and DiT's)",
            "set `trainer.fused_qkv=false`",
        )
