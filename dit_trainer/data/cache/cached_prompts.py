"""The text encoder's stand-in when training from a cache: the conditions precompute wrote for the run's prompts."""

from __future__ import annotations

import torch

from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.errors import ConfigError


class CachedPrompts:
    """Stands in for the text encoder when training from a cache: the conditions of the prompts precompute was
    told about (``prompts.sampled_prompts``), so the real encoder is never loaded. ``cache_dir``: the cache they
    were read from (``data.cache_dir``), which a missing prompt's refusal names."""

    def __init__(self, prompts: list[str], condition: Condition, device: torch.device, cache_dir: str = "") -> None:
        self.cache_dir = cache_dir
        self.rows = {prompt: row for row, prompt in enumerate(prompts)}
        self.condition = condition.cast(torch.float32)._replace(mask=condition.mask.long()).to(device)

    @property
    def size(self) -> ConditionSize:
        pooled = self.condition.pooled
        return ConditionSize(self.condition.sequence.shape[-1], None if pooled is None else pooled.shape[-1])

    @property
    def device(self) -> torch.device:
        return self.condition.sequence.device

    def check_prompts(self, prompts: list[str]) -> None:
        self.encode(prompts)

    def encode(self, prompts: list[str]) -> Condition:
        missing = [p for p in prompts if p not in self.rows]
        if missing:
            raise ConfigError(
                "data.cache_dir",
                self.cache_dir,
                f"the cache holds no embedding for the prompts {missing[:3]} (sample and monitor prompts are "
                "embedded by precompute)",
                "run `python scripts/precompute.py` again with this run's overrides: it adds the missing prompts "
                "without re-encoding the images",
            )
        if len(prompts) == 1:  # caption dropout's "" at every step: a view, no index tensor copied to the device
            row = self.rows[prompts[0]]
            return self.condition.rows(slice(row, row + 1))
        return self.condition.rows(torch.tensor([self.rows[p] for p in prompts], device=self.device))
