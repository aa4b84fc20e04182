"""The EMA of the trained weights: diffusers' ``EMAModel`` (its decay schedule, state dict and checkpoint format),
with the update done in place by one fused kernel."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from diffusers.training_utils import EMAModel

from dit_trainer.sharding import is_sharded


class FusedEMA(EMAModel):
    """``shadow += (1 - decay) * (param - shadow)`` as one ``torch._foreach_lerp_`` over all parameters.

    diffusers' foreach update first materialises ``shadow - param`` for every parameter; on a small DiT that
    temporary copy was most of the trainer's overhead over the bare forward/backward/AdamW step. Every parameter
    handed here trains (``requires_grad``).
    """

    @torch.no_grad()
    def step(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        self.optimization_step += 1
        self.cur_decay_value = self.get_decay(self.optimization_step)
        torch._foreach_lerp_(self.shadow_params, list(parameters), 1 - self.cur_decay_value)  # no_grad: read only

    def store(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """diffusers keeps the stored weights on the CPU. Sharded (FSDP2) slices stay where they are: they are 1/N of
        the model, and a ``DTensor`` moved to the CPU would no longer match its device mesh when copied back."""
        parameters = list(parameters)
        if is_sharded(parameters):
            self.temp_stored_params = [parameter.detach().clone() for parameter in parameters]
        else:
            super().store(parameters)
