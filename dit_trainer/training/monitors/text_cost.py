"""A warning at start when the frozen text encoder runs on every batch and costs a large share of each step's
compute. ``experiment=dit`` encodes 64 captions of 120 tokens with T5-XXL (4.7 B parameters) every step, ~72 TFLOP,
more than DiT-XL/2's own forward and backward (~57 TFLOP): half the GPU time goes to work that gives the same
answer every epoch. Encoding the captions once (``scripts/precompute.py``) and training from ``data.cache_dir``
removes it, and the text encoder's memory with it."""

from __future__ import annotations

from accelerate.logging import get_logger
from torch import nn

from dit_trainer.components.build import Components
from dit_trainer.components.meta import count_flops, meta_inputs
from dit_trainer.config import ConditionerConfig

logger = get_logger(__name__)

SHARE = 0.25  # of the DiT's training FLOPs per step: from here on, caching the text embeddings is worth a warning


def encoding_flops(text_encoder: nn.Module, tokens: int) -> float:
    """About the FLOPs of encoding one prompt padded to ``tokens``: two per weight per token in every layer that
    multiplies (embedding tables only look up). Counted from the parameters rather than on the meta device, where
    transformers' encoders fail on their branches on the attention mask's values."""
    weights = sum(
        parameter.numel()
        for module in text_encoder.modules()
        if not isinstance(module, nn.Embedding)
        for parameter in module.parameters(recurse=False)
    )
    return 2.0 * weights * tokens


def live_encoding_cost(
    conditioner: ConditionerConfig, batch_size: int, parts: Components
) -> tuple[float, float] | None:
    """(text encoder, DiT forward + backward) FLOPs per step of ``batch_size`` images when every caption is
    encoded every step: no cache (``data.cache_dir``), no memo (``conditioner.memo_size``; with one, captions
    that repeat are encoded once), and an encoder with weights (class labels have none). None otherwise. (Asked
    only of a method that trains on the data set's captions.)"""
    encoder = parts.text_encoder
    if conditioner.memo_size or not isinstance(encoder, nn.Module):
        return None
    per_token = encoding_flops(encoder, 1)
    if not per_token:
        return None
    inputs = meta_inputs(parts, 1)
    text = per_token * inputs[2].sequence.shape[1]
    return text * batch_size, count_flops(parts.dit, *inputs)[1] * batch_size


def warn_live_text_encoding(conditioner: ConditionerConfig, batch_size: int, parts: Components) -> None:
    """Say at start, with both FLOP counts, when live text encoding costs ``SHARE`` of the DiT's step or more."""
    cost = live_encoding_cost(conditioner, batch_size, parts)
    if cost is None or cost[0] < SHARE * cost[1]:
        return
    text, dit = cost
    logger.warning(
        f"The text encoder encodes every caption every step: about {text / 1e12:.3g} TFLOP per step of "
        f"trainer.batch_size={batch_size}, against {dit / 1e12:.3g} TFLOP for the DiT's forward and "
        f"backward ({text / dit:.0%}). Encode the captions once and train from the cache, which never loads the text "
        "encoder: `python scripts/precompute.py <these overrides> data.cache_dir=DIR`, then add `data.cache_dir=DIR` "
        "to the training command (or set `conditioner.memo_size` when captions repeat).",
        main_process_only=True,
    )
