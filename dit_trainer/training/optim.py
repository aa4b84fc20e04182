"""The optimizer side of a run: AdamW over what trains, the diffusers LR schedule, and the EMA of the weights."""

from __future__ import annotations

import torch
from diffusers.optimization import get_scheduler

from dit_trainer.components.dit import DiTAdapter
from dit_trainer.config import TrainConfig
from dit_trainer.training.ema import FusedEMA


def optimizer_groups(dit: DiTAdapter, weight_decay: float) -> list[dict]:
    """The DiT's trainable parameters in AdamW groups. A learned-variance DiT (2 x latent channels out, as
    pretrained PixArt) has its variance outputs ignored by the loss: their rows of ``proj_out`` get zero gradient,
    so AdamW leaves them as loaded unless weight decay shrinks them. ``proj_out`` is therefore exempt from weight
    decay: the variance half stays frozen, not silently decayed towards zero."""
    named = [(name, p) for name, p in dit.named_parameters() if p.requires_grad]
    config = dit.transformer.config
    if not weight_decay or config.out_channels == config.in_channels:
        return [{"params": [p for _, p in named]}]
    exempt = [p for name, p in named if name.startswith("transformer.proj_out.")]
    rest = [p for name, p in named if not name.startswith("transformer.proj_out.")]
    return [{"params": rest}, {"params": exempt, "weight_decay": 0.0}]


def build_optimizer(cfg: TrainConfig, dit: DiTAdapter) -> torch.optim.Optimizer:
    """AdamW over what trains in ``dit``, with the fused kernel: one kernel for all parameters instead of a loop
    over them."""
    o = cfg.optim
    return torch.optim.AdamW(
        optimizer_groups(dit, o.weight_decay),
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        weight_decay=o.weight_decay,
        fused=True,
    )


def build_lr_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, updates_per_step: int = 1):
    """The diffusers LR schedule, counted in optimizer updates (a GRPO step makes ``updates_per_step``) whatever the
    number of processes: the accelerator does not step it with the optimizer (``build_accelerator``), the update
    steps it once per update it applies. So a run resumed on another number of processes continues the same
    schedule (accelerate's own stepping advances it once per process and would need lengths in processes x updates,
    which a checkpoint then carries into a resume on another count)."""
    return get_scheduler(
        cfg.optim.lr_schedule,
        optimizer,
        num_warmup_steps=cfg.optim.warmup_steps,
        num_training_steps=cfg.trainer.max_steps * updates_per_step,
    )


def build_ema(cfg: TrainConfig, parameters: list[torch.nn.Parameter]) -> FusedEMA | None:
    """The EMA of what trains (the whole DiT, or a LoRA run's adapters), where the prepared ``parameters`` are
    (under FSDP: a slice per process); None with ``trainer.ema_decay=0``."""
    if cfg.trainer.ema_decay == 0:
        return None
    return FusedEMA(parameters, decay=cfg.trainer.ema_decay)
