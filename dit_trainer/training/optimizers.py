"""The optimizers ``optim.name`` picks, each from the package that maintains it, and the checks that keep a choice
from failing deep in a run.

- ``adamw``: torch's AdamW with the fused kernel (the default).
- ``adamw8bit``: bitsandbytes' ``AdamW8bit``, its two moments stored in 8 bits (a quarter of AdamW's optimizer
  memory); bitsandbytes keeps tensors under 4,096 values in 32 bits. It runs on CUDA, and on the CPU with recent
  releases (0.50.2 measured).
- ``adafactor``: ``torch.optim.Adafactor`` (torch 2.5 and later: always here, as the package needs torch 2.6). Chosen
  over transformers' ``Adafactor`` because PyTorch maintains it with its other optimizers in the package every run
  has (foreach kernels, the standard ``state_dict``, its ``lr`` driven by the LR schedule), while transformers' is a
  port of fairseq's whose default ``relative_step`` mode computes its own learning rate and ignores the schedule.
  Its ``lr`` is a relative step: an update's size is about ``lr`` x the parameter's RMS (at least 1e-3), capped by
  1/sqrt(step); torch's default is 1e-2. It keeps factored second moments (a row and a column vector per matrix) and
  no first moment.
- ``prodigy``: prodigyopt's ``Prodigy``, Adam with a step size it estimates as it trains: ``optim.lr`` multiplies that
  estimate (1.0 is its convention, and a small lr is refused) and ``optim.d_coef`` tunes it. With a warm-up in the
  schedule its ``safeguard_warmup`` is on, as its authors advise (the small early steps would otherwise make it
  overestimate the step size). Bias correction stays off (its default): on a tiny DiT it held the estimate near its
  start (1e-6) for 60 steps under a cosine schedule. Its estimate lives in the parameter groups: checkpoints keep it.

The optional packages are imported when chosen: the config check refuses a missing one in one paragraph, with the
install command, before any model is built. Under FSDP only ``adamw`` is accepted: the others are untested on its
sharded (DTensor) parameters.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from dit_trainer.config import OptimConfig
from dit_trainer.errors import ConfigError, require

# Prodigy's lr multiplies the step size it estimates: below this it is a learning rate meant for another optimizer.
PRODIGY_MIN_LR = 0.1


def _adamw(groups: list[dict], o: OptimConfig) -> torch.optim.Optimizer:
    betas = (o.beta1, o.beta2)
    return torch.optim.AdamW(groups, lr=o.lr, betas=betas, eps=o.eps, weight_decay=o.weight_decay, fused=True)


def _adamw8bit(groups: list[dict], o: OptimConfig) -> torch.optim.Optimizer:
    from bitsandbytes.optim import AdamW8bit

    return AdamW8bit(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)


def _adafactor(groups: list[dict], o: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.Adafactor(groups, lr=o.lr, weight_decay=o.weight_decay)


def _prodigy(groups: list[dict], o: OptimConfig) -> torch.optim.Optimizer:
    from prodigyopt import Prodigy

    return Prodigy(
        groups,
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        weight_decay=o.weight_decay,
        d_coef=o.d_coef,
        safeguard_warmup=o.warmup_steps > 0 and o.lr_schedule != "constant",  # `constant` has no warm-up
    )


@dataclass(frozen=True)
class OptimizerChoice:
    """How to build one ``optim.name``, and the package it needs beyond the base install (None: torch's own)."""

    build: Callable[[list[dict], OptimConfig], torch.optim.Optimizer]
    # Its state in bytes per byte of fp32 trained parameter, for the memory estimate: AdamW's two fp32 moments are 2;
    # 8-bit moments 0.5; Adafactor's row and column vectors next to nothing; Prodigy's moments, s and p0 4.
    state_per_parameter_byte: float
    package: str | None = None  # the module to import
    install: str | None = None  # the command that installs it

    def missing(self) -> str | None:
        """Why the package cannot be used here (not installed, or it fails to import), or None."""
        if self.package is None:
            return None
        try:
            importlib.import_module(self.package)
        except ImportError as error:
            return f"{self.package} is not installed ({error})"
        except Exception as error:  # bitsandbytes raises its own errors where it has no backend
            return f"{self.package} is installed but does not load here ({type(error).__name__}: {error})"
        return None


OPTIMIZER_CHOICES = {
    "adamw": OptimizerChoice(_adamw, 2.0),
    "adamw8bit": OptimizerChoice(_adamw8bit, 0.5, "bitsandbytes", "pip install bitsandbytes"),
    "adafactor": OptimizerChoice(_adafactor, 0.0),
    "prodigy": OptimizerChoice(_prodigy, 4.0, "prodigyopt", "pip install prodigyopt"),
}


def check_optimizer(o: OptimConfig) -> None:
    """Refuse Prodigy with a learning rate meant for another optimizer, and an optimizer whose package is missing
    (with the install command); run with the config checks, before any model is built."""
    require(
        o.name != "prodigy" or o.lr >= PRODIGY_MIN_LR,
        "optim.lr",
        o.lr,
        "Prodigy estimates the step size itself and `optim.lr` multiplies its estimate (1.0 is its convention), so "
        f"a learning rate below {PRODIGY_MIN_LR} meant for AdamW would shrink every step by that factor",
        "set `optim.lr=1.0` with `optim.name=prodigy`, and scale its estimate with `optim.d_coef` (e.g. 0.5 or 2)",
    )
    choice = OPTIMIZER_CHOICES[o.name]
    reason = choice.missing()
    require(
        reason is None,
        "optim.name",
        o.name,
        f"it needs the optional package {choice.package}, and {reason}",
        f"install it with `{choice.install}` (or `pip install 'dit-trainer[optimizers]'`), or use `optim.name=adamw`",
    )


def check_sharded_optimizer(o: OptimConfig, sharded: bool) -> None:
    """Under FSDP (``sharded``) only AdamW: the others have not been run on sharded (DTensor) parameters, and
    Prodigy's and Adafactor's statistics are sums over whole tensors. Checked right after the accelerator starts."""
    require(
        not sharded or o.name == "adamw",
        "optim.name",
        o.name,
        "this launch shards the model with FSDP, and only `adamw` is supported on sharded parameters",
        "use `optim.name=adamw`, or launch without FSDP (one process, or DDP)",
    )


def make_optimizer(groups: list[dict], o: OptimConfig) -> torch.optim.Optimizer:
    """The optimizer ``o.name`` over parameter ``groups`` (``optim.optimizer_groups``)."""
    return OPTIMIZER_CHOICES[o.name].build(groups, o)


def check_resumed_optimizer(checkpoint: Path, saved: dict, current: dict) -> None:
    """A checkpoint's optimizer state continues only in the optimizer that wrote it. ``saved`` and ``current``: the
    checkpoint's and this run's configs as dicts (one from before there was a choice trained AdamW)."""
    old, new = (config.get("optim", {}).get("name") or "adamw" for config in (saved, current))
    if old != new:
        raise ConfigError(
            "optim.name",
            new,
            f"the checkpoint {checkpoint} holds the state of `{old}`, which `{new}` cannot continue from",
            f"resume with `optim.name={old}`, or start a fresh run in a new `hydra.run.dir`",
        )
