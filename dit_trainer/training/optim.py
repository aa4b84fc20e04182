"""The optimizer side of a run: the optimizer over what trains (``optimizers``), the diffusers LR schedule, and the
EMA of the weights."""

from __future__ import annotations

import dataclasses

import torch
from accelerate.logging import get_logger
from diffusers.optimization import get_scheduler

from dit_trainer.components.dit import DiTAdapter
from dit_trainer.config import OptimConfig
from dit_trainer.training.optimizers import make_optimizer
from dit_trainer.training.state.ema import FusedEMA

logger = get_logger(__name__)
CLIPPED_WARMUP_SHARE = 10  # a warm-up as long as the run or longer is cut to this fraction (1/10) of the run


def optimizer_groups(dit: DiTAdapter, weight_decay: float) -> list[dict]:
    """The DiT's trainable parameters in optimizer groups. A learned-variance DiT (2 x latent channels out, as
    pretrained PixArt) has its variance outputs ignored by the loss: their rows of ``proj_out`` get zero gradient,
    so the optimizer (any ``optim.name``) leaves them as loaded unless weight decay shrinks them. ``proj_out`` is
    therefore exempt from weight decay: the variance half stays frozen, not silently decayed towards zero."""
    named = [(name, p) for name, p in dit.named_parameters() if p.requires_grad]
    config = dit.transformer.config  # Z-Image's names no `out_channels`: its output is its input's size
    if not weight_decay or config.get("out_channels", config.get("in_channels")) == config.get("in_channels"):
        return [{"params": [p for _, p in named]}]
    exempt = [p for name, p in named if name.startswith("transformer.proj_out.")]
    rest = [p for name, p in named if not name.startswith("transformer.proj_out.")]
    return [{"params": rest}, {"params": exempt, "weight_decay": 0.0}]


def build_optimizer(optim: OptimConfig, dit: DiTAdapter) -> torch.optim.Optimizer:
    """The ``optim.name`` optimizer (fused AdamW by default: one kernel for all parameters instead of a loop over
    them) over what trains in ``dit``, in the groups above."""
    return make_optimizer(optimizer_groups(dit, optim.weight_decay), optim)


def build_lr_scheduler(optim: OptimConfig, optimizer: torch.optim.Optimizer, updates: int):
    """The diffusers LR schedule over the run's ``updates`` (``trainer.max_steps`` x the updates a step makes: a
    GRPO step makes several), counted in optimizer updates whatever the number of processes: the accelerator does
    not step it with the optimizer (``training.launch.build_accelerator``), the update steps it once per update it
    applies. So a run resumed on another number of processes continues the same
    schedule (accelerate's own stepping advances it once per process and would need lengths in processes x updates,
    which a checkpoint then carries into a resume on another count)."""
    return get_scheduler(
        optim.lr_schedule,
        optimizer,
        num_warmup_steps=optim.warmup_steps,
        num_training_steps=updates,
    )


def warmup_within_run(optim: OptimConfig, max_steps: int, updates_per_step: int = 1) -> OptimConfig:
    """``optim`` with its ``warmup_steps`` (counted in optimizer updates) cut to a tenth of the run where it is as long
    as the run or longer, with a warning naming both: such a warm-up never reaches ``optim.lr`` (the 500-step default
    left a 40-step run at 6e-6 instead of 1e-4). A tenth leaves 90 % of the run at the set rate, as the
    ``warmup_ratio=0.1`` habit of Hugging Face's trainers does; a run under ten updates gets none.
    The returned section is what the run records, so its saved config says what was trained."""
    updates = max_steps * updates_per_step
    if optim.lr_schedule == "constant" or optim.warmup_steps < updates:  # `constant` has no warm-up
        return optim
    clipped = updates // CLIPPED_WARMUP_SHARE
    per_step = f" x {updates_per_step} updates per step = {updates} updates" if updates_per_step > 1 else ""
    logger.warning(
        f"`optim.warmup_steps={optim.warmup_steps}` is as long as the run or longer "
        f"(`trainer.max_steps={max_steps}`{per_step}): the learning rate would still be warming up when "
        f"the run ends (at {updates / optim.warmup_steps:.0%} of `optim.lr={optim.lr:g}`). Warming up over {clipped} "
        f"instead (a tenth of the run); set `optim.warmup_steps` below {updates} to choose another.",
        main_process_only=True,
    )
    return dataclasses.replace(optim, warmup_steps=clipped)


def build_ema(decay: float, parameters: list[torch.nn.Parameter]) -> FusedEMA | None:
    """The EMA of what trains (the whole DiT, or a LoRA run's adapters), where the prepared ``parameters`` are
    (under FSDP: a slice per process), at ``trainer.ema_decay``; None when it is 0."""
    if decay == 0:
        return None
    return FusedEMA(parameters, decay=decay)


class ConfiguredRates:
    """The optimizer settings the config sets (each group's weight decay, betas and eps) and the schedule's base
    rates, taken before a resume loads a checkpoint's: ``reapply`` puts them back over the loaded state, so that an
    ``optim.lr`` or ``optim.weight_decay`` changed on resuming (a change the resume accepts, and names) is what
    trains. The moments, the step counts, the schedule's position and what an optimizer learns in its groups
    (Prodigy's step-size estimate) stay the checkpoint's; the current rate moves with the base rate (the schedule's
    factor at that position is kept)."""

    KEYS = ("weight_decay", "betas", "eps")  # what `optimizers.make_optimizer` sets from the config

    def __init__(self, optimizer: torch.optim.Optimizer, lr_scheduler) -> None:
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.groups = [{k: group[k] for k in self.KEYS if k in group} for group in optimizer.param_groups]
        self.base_lrs = list(lr_scheduler.state_dict()["base_lrs"])

    def reapply(self) -> None:
        state = self.lr_scheduler.state_dict()
        scales = [new / old if old else 1.0 for new, old in zip(self.base_lrs, state["base_lrs"], strict=True)]
        rates = [rate * scale for rate, scale in zip(state["_last_lr"], scales, strict=True)]
        self.lr_scheduler.load_state_dict({**state, "base_lrs": list(self.base_lrs), "_last_lr": rates})
        groups = zip(self.optimizer.param_groups, self.groups, rates, self.base_lrs, strict=True)
        for group, settings, rate, base in groups:
            group.update(settings, lr=rate, initial_lr=base)
