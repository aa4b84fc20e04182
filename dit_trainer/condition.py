"""What a DiT is conditioned on, as one object: the seam between conditioners (text encoders, class labels, a cache
of their outputs) and the families that consume them.

A ``Condition`` is a named tuple so that DDP, FSDP and ``torch.compile`` see its tensors (they recurse into named
tuples, not into dataclasses), and so that code written for the old ``(embeds, mask)`` pair fails loudly instead of
silently dropping the pooled vector.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypedDict

import torch


@dataclass(frozen=True)
class ConditionSize:
    """The widths of what a conditioner gives: ``sequence`` (hidden size, or the number of classes) and ``pooled``
    (None: no pooled vector). A new transformer's conditioning inputs are sized by it; a loaded one is checked
    against it."""

    sequence: int
    pooled: int | None = None


# The storage names of the fields, in caches and in the prompt table: "text_embeds", "text_mask", "text_pooled".
STORED_NAMES = {"sequence": "embeds", "mask": "mask", "pooled": "pooled"}


class Batch(TypedDict, total=False):
    """What a training batch carries from the data to the loss (``data.collate.collate_batch`` makes it; every key
    but ``bad_files`` depends on where the items came from, and on whether any were drawn). Images come as pixels
    from a source, or as a posterior from a latent cache, whose items also hold their stored condition
    (``Condition.stored("text_")``) where a disk cache encoded the captions once."""

    image: torch.Tensor  # (B, 3, H, W): uint8 as decoded, or float in [-1, 1] (``pixels.to_model_range`` takes both)
    latent_mean: torch.Tensor  # (B, C, h, w): the VAE posterior's mean, from a latent cache
    latent_std: torch.Tensor  # (B, C, h, w): its standard deviation; absent for a deterministic autoencoder
    text_embeds: torch.Tensor  # (B, L, D): a disk cache's stored condition (or (B,) class ids) ...
    text_mask: torch.Tensor  # (B, L)
    text_pooled: torch.Tensor  # (B, P), where the conditioner gives a pooled vector
    caption: list[str]  # the captions (or class names)
    source_index: list[int]  # the source item each image was read from (an unreadable one's replacement), where known
    bad_files: list[str]  # "name: reason" for each unreadable file skipped to fill the batch: always present
    empty: bool  # a Poisson draw (DP) that selected no image: then nothing but this and ``bad_files``


class Condition(NamedTuple):
    """``sequence``: (B, L, D) hidden states (or (B,) class ids); ``mask``: (B, L), 1 for real tokens; ``pooled``:
    (B, P), one vector per prompt (CLIP's pooled output, a mean-pooled sentence embedding), or None when the
    conditioner gives none. Every field has the batch first, so rows select, concatenate and mix alike."""

    sequence: torch.Tensor
    mask: torch.Tensor
    pooled: torch.Tensor | None = None

    def _map(self, function) -> Condition:
        return Condition(*(None if tensor is None else function(tensor) for tensor in self))

    @property
    def batch_size(self) -> int:
        return self.sequence.shape[0]

    def rows(self, index: torch.Tensor | slice) -> Condition:
        """The rows ``index`` of every field."""
        return self._map(lambda tensor: tensor[index])

    def expand(self, count: int) -> Condition:
        """A one-row condition repeated ``count`` times (a view, no copy)."""
        return self._map(lambda tensor: tensor.expand(count, *tensor.shape[1:]))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Condition:
        return self._map(lambda tensor: tensor.to(device, non_blocking=non_blocking))

    def cast(self, dtype: torch.dtype) -> Condition:
        """Floating fields in ``dtype`` (the DiT's compute dtype); masks and class ids keep theirs."""
        return self._map(lambda tensor: tensor.to(dtype) if tensor.is_floating_point() else tensor)

    def where(self, keep: torch.Tensor, other: Condition) -> Condition:
        """Row ``i`` of ``self`` where ``keep[i]``, else of ``other`` (one row, broadcast): caption dropout."""
        mixed = []
        for mine, theirs in zip(self, other):
            if mine is None:
                mixed.append(None)
                continue
            shaped = keep.reshape(-1, *([1] * (mine.dim() - 1)))
            mixed.append(torch.where(shaped, mine, theirs))
        return Condition(*mixed)

    @staticmethod
    def cat(conditions: Sequence[Condition]) -> Condition:
        """The conditions' rows, one after another (CFG's conditional and empty-prompt halves)."""
        columns = zip(*conditions)
        return Condition(*(None if parts[0] is None else torch.cat(list(parts)) for parts in columns))

    @staticmethod
    def stack(conditions: Sequence[Condition]) -> Condition:
        """One-row-each conditions (without their batch dimension) stacked into a batch."""
        columns = zip(*conditions)
        return Condition(*(None if parts[0] is None else torch.stack(list(parts)) for parts in columns))

    def stored(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """The fields by their storage names (``prefix`` + embeds | mask | pooled), None fields left out."""
        return {prefix + STORED_NAMES[name]: tensor for name, tensor in self._asdict().items() if tensor is not None}

    @staticmethod
    def from_stored(tensors: Mapping[str, torch.Tensor], prefix: str = "") -> Condition | None:
        """The condition ``stored`` wrote (None when ``tensors`` holds none)."""
        if prefix + STORED_NAMES["sequence"] not in tensors:
            return None
        return Condition(**{name: tensors.get(prefix + stored) for name, stored in STORED_NAMES.items()})
