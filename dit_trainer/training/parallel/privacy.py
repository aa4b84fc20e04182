"""Differentially private training (DP-SGD) with Opacus: per-sample clipping, Gaussian noise, Poisson sampling.

What changes against a normal step: each step's batch is Poisson-sampled (``PoissonBatchSampler``); the (B,) loss
is back-propagated by Opacus (ghost clipping: a second backward re-weights each sample's loss so the summed
gradient is the sum of clipped ones, without storing per-sample gradients); the DP optimizer adds noise; the
accountant tracks epsilon, which is logged as ``privacy/epsilon`` and saved in every checkpoint.

Every trainable parameter gets a per-sample gradient: PixArt's modulation tables, which Opacus cannot see, are
moved into modules it can (``components.modulation``); nothing is frozen to make DP work.

A module that several parents hold (the DiT's timestep-and-label embedder, shared by every block) is hooked once:
Opacus hooks every path to a module, which would count its per-sample gradients once per parent. Its per-sample
gradient is then right in both modes as long as it runs once per forward (what ghost clipping requires; the DiT family
arranges it for its embedder) or, with ``privacy.mode=hooks``, on the same inputs at each call.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from opacus import PrivacyEngine
from opacus.accountants.utils import get_noise_multiplier
from opacus.grad_sample import GradSampleHooks, register_grad_sampler
from opacus.optimizers import DPOptimizer
from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dit_trainer.components.modulation import (
    BlockModulation,
    OutputModulation,
    block_modulation_grad_sample,
    output_modulation_grad_sample,
)
from dit_trainer.config import PrivacyConfig
from dit_trainer.data.loading import require_full_batches
from dit_trainer.data.poisson import PoissonBatchSampler, collate_poisson
from dit_trainer.data.seeded_items import SeededItems
from dit_trainer.errors import ConfigError, shortlist

logging.getLogger("opacus").setLevel(logging.WARNING)  # it logs every hooked layer at INFO
register_grad_sampler(BlockModulation)(block_modulation_grad_sample)
register_grad_sampler(OutputModulation)(output_modulation_grad_sample)


def without_per_sample_gradients(model: nn.Module) -> list[str]:
    """Trainable parameters that no Opacus grad sampler covers (their module has none registered): Opacus' fallback
    would fail on them or mis-clip them."""
    return [
        f"{module_name}.{name}".lstrip(".")
        for module_name, module in model.named_modules()
        for name, parameter in module.named_parameters(recurse=False)
        if parameter.requires_grad and type(module) not in GradSampleHooks.GRAD_SAMPLERS
    ]


def coverage_report(model: nn.Module) -> list[str]:
    """For ``verify_gradients.py``: which parameters get per-sample gradients, and how."""
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    moved = [name for name, module in model.named_modules() if isinstance(module, (BlockModulation, OutputModulation))]
    uncovered = without_per_sample_gradients(model)
    lines = [
        f"Differential privacy: {len(trainable) - len(uncovered)} of {len(trainable)} trainable tensors get "
        "per-sample gradients from Opacus grad samplers; none is frozen to make DP work.",
        f"  PixArt modulation tables moved into per-sample modules: {len(moved)} ({', '.join(moved[:3])}"
        f"{' ...' if len(moved) > 3 else ''})",
    ]
    if uncovered:
        lines.append(f"  without a per-sample gradient (DP cannot train them): {', '.join(uncovered)}")
    return lines


def check_model(model: nn.Module) -> None:
    """One paragraph for layers Opacus cannot train privately (BatchNorm mixes samples; others lack a grad
    sampler), instead of an error from inside its hooks at the first backward."""
    problems = [str(error).strip() for error in ModuleValidator.validate(model, strict=False)]
    fixes = (
        ["replace BatchNorm with GroupNorm or LayerNorm (`opacus.validators.ModuleValidator.fix`)"] if problems else []
    )
    uncovered = without_per_sample_gradients(model)
    if uncovered:
        layers = sorted({type(model.get_submodule(name.rpartition(".")[0])).__name__ for name in uncovered})
        problems.append(
            f"no per-sample gradient for {shortlist(uncovered, 6)} (Opacus has no grad sampler for "
            f"{' or '.join(layers)})"
        )
        fixes.append("freeze those parameters (e.g. train LoRA adapters: `lora.enabled=true`)")
    if problems:
        raise ConfigError(
            "privacy.enabled",
            True,
            f"Opacus cannot train this DiT with differential privacy: {'; '.join(problems[:4])}",
            ", or ".join(fixes),
        )


def check_private_launch(accelerator: Accelerator) -> None:
    """What the config alone cannot tell: several processes (per-rank Poisson sampling and noise are not built
    here), FSDP (Opacus computes per-sample gradients of whole parameters, and FSDP holds slices) and fp16 chosen by
    ``trainer.mixed_precision=auto``."""
    if accelerator.distributed_type == DistributedType.FSDP:
        raise ConfigError(
            "privacy.enabled",
            True,
            "DP-SGD clips each sample's gradient of whole parameters, and this launch shards them with FSDP",
            "launch `python train.py ...` without an FSDP accelerate config; DP runs in one process",
        )
    if accelerator.num_processes > 1:
        raise ConfigError(
            "privacy.enabled",
            True,
            f"DP training runs in one process, and this launch has {accelerator.num_processes}",
            "launch `python train.py ...` (or `accelerate launch --num_processes 1`); scale the expected batch with "
            "`trainer.batch_size`",
        )
    if accelerator.mixed_precision == "fp16":
        raise ConfigError(
            "trainer.mixed_precision",
            "auto (fp16 on this GPU)",
            "fp16's loss scaling would scale the per-sample gradients that DP clips",
            "set `trainer.mixed_precision=no` (or bf16 on a GPU that has it)",
        )


def noise_multiplier(cfg: PrivacyConfig, sample_rate: float, max_steps: int, delta: float) -> float:
    """``privacy.noise_multiplier``, or the sigma that spends ``target_epsilon`` over ``epochs`` (default: the
    run's ``max_steps``). A run longer than the calibrated budget is refused: it would exceed the target."""
    if cfg.noise_multiplier is not None:
        return cfg.noise_multiplier
    steps = max_steps if cfg.epochs is None else math.floor(cfg.epochs / sample_rate)
    if max_steps > steps:
        raise ConfigError(
            "privacy.epochs",
            cfg.epochs,
            f"the noise would be calibrated for {steps} steps, but `trainer.max_steps` is {max_steps}, which would "
            f"spend more than `privacy.target_epsilon={cfg.target_epsilon}`",
            f"set `privacy.epochs={max_steps * sample_rate:.3g}` or more (or null: calibrate for trainer.max_steps), "
            f"or lower `trainer.max_steps` to {steps}",
        )
    return get_noise_multiplier(
        target_epsilon=cfg.target_epsilon,
        target_delta=delta,
        sample_rate=sample_rate,
        steps=steps,
        accountant=cfg.accountant,
    )


@contextlib.contextmanager
def one_path_per_module(model: nn.Module) -> Iterator[None]:
    """Each module stays reachable from its first parent only (a later parent's entry reads None meanwhile), so that
    Opacus, which walks ``children()`` without skipping modules it has seen, hooks a shared module once. The hooks
    belong to the module, not to the path: afterwards every parent's call of it is recorded, once per call."""
    seen, detached = {id(model)}, []

    def walk(parent: nn.Module) -> None:
        for name, child in parent._modules.items():
            if child is None:
                continue
            if id(child) in seen:
                detached.append((parent, name, child))
            else:
                seen.add(id(child))
                walk(child)

    walk(model)
    for parent, name, _ in detached:
        parent._modules[name] = None  # in place: the parent's order of children is kept
    try:
        yield
    finally:
        for parent, name, child in detached:
            parent._modules[name] = child


@dataclass
class PrivateTraining:
    """The DP side of a run: how the (B,) loss is back-propagated, and the privacy spent."""

    engine: PrivacyEngine
    hooks: Any  # Opacus' GradSampleHooks (mode=hooks) or GradSampleHooksFastGradientClipping (mode=ghost)
    optimizer: DPOptimizer
    mode: str
    delta: float
    noise_multiplier: float
    sample_rate: float

    def saved_states(self) -> dict[str, Any]:
        """What a checkpoint keeps of DP, by name: the accountant (the privacy spent so far; ``state_dict``)."""
        return {"privacy_accountant": self}

    def generators(self) -> dict[str, torch.Generator]:
        """The noise's generator, by its name in a checkpoint's per-process state (``TrainingState``)."""
        return {"dp_noise": self.optimizer.generator}

    def backward(self, per_sample_loss: torch.Tensor) -> None:
        """Gradients of the mean loss such that the DP optimizer can clip each sample's share."""
        if self.mode == "ghost":
            DPTensorFastGradientClipping(self.hooks, self.optimizer, per_sample_loss, "mean").backward()
        else:
            per_sample_loss.mean().backward()

    def noise_gradient(self) -> None:
        """Each sample's gradient clipped, summed and noised into ``.grad`` (the first half of the DP optimizer's
        step; the accountant records the step here), so that it can be checked before ``apply_gradient``."""
        if not self.optimizer.pre_step():
            raise RuntimeError("Opacus skipped the step: virtual steps are not used by this trainer")

    def apply_gradient(self) -> None:
        """The second half of the DP optimizer's step: the wrapped optimizer applies the noised gradient."""
        self.optimizer.original_optimizer.step()

    def backward_empty(self) -> None:
        """The gradient state of a batch without samples: a zero sum, to which the optimizer adds only noise."""
        for parameter in self.optimizer.params:
            if self.mode == "ghost":
                parameter.grad = torch.zeros_like(parameter)
            else:
                parameter.grad_sample = parameter.new_zeros((0, *parameter.shape))

    @contextlib.contextmanager
    def hooks_paused(self) -> Iterator[None]:
        """Let a diagnostic backward (the preflight) run without Opacus recording per-sample state."""
        self.hooks.disable_hooks()
        try:
            yield
        finally:
            self.hooks.enable_hooks()

    def epsilon(self) -> float:
        return float(self.engine.get_epsilon(self.delta))

    def state_dict(self) -> dict[str, Any]:
        """The accountant's history as JSON: [(noise multiplier, sample rate, steps), ...]."""
        history = [list(entry) for entry in self.engine.accountant.history]
        return {"mechanism": self.engine.accountant.mechanism(), "history": history, "delta": self.delta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["mechanism"] != self.engine.accountant.mechanism():
            raise ConfigError(
                "privacy.accountant",
                self.engine.accountant.mechanism(),
                f"the checkpoint's privacy was accounted with `{state['mechanism']}`",
                f"resume with `privacy.accountant={state['mechanism']}`",
            )
        self.engine.accountant.history = [tuple(entry) for entry in state["history"]]

    def describe(self) -> str:
        return (
            f"Differential privacy ({self.mode} clipping): noise multiplier {self.noise_multiplier:.4g}, clipping "
            f"norm {self.optimizer.max_grad_norm:g}, sample rate {self.sample_rate:.4g} (Poisson), delta "
            f"{self.delta:.3g}, {self.engine.accountant.mechanism()} accountant; noise from torch's seeded generator "
            "(reproducible on resume, not a cryptographically secure source)."
        )


def make_private(
    cfg: PrivacyConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    batch_size: int,
    max_steps: int,
    seed: int,
    loader_options: dict[str, Any],
    device: torch.device,
) -> tuple[PrivateTraining, DPOptimizer, DataLoader]:
    """Attach Opacus to ``model`` (hooks, not a wrapper: the model keeps its type) and return the DP side of the
    run, the DP optimizer and a Poisson-sampled loader with ``batch_size`` as its expected batch size."""
    # The first layer's input (noisy latents) needs no gradient; Opacus only needs the hook's output gradients.
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
    warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")  # a bound inside PRV
    check_model(model)
    require_full_batches(len(dataset), batch_size, processes=1)
    steps_per_epoch = len(dataset) // batch_size
    sampler = PoissonBatchSampler(len(dataset), steps_per_epoch, seed, keyed=isinstance(dataset, SeededItems))
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_poisson, **loader_options)
    delta = cfg.delta if cfg.delta is not None else 1 / len(dataset)
    sigma = noise_multiplier(cfg, sampler.sample_rate, max_steps, delta)
    with warnings.catch_warnings():
        # Opacus' warning is about its secure_mode; describe() says what noise source this run uses.
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        engine = PrivacyEngine(accountant=cfg.accountant)
    with one_path_per_module(model):
        hooks, dp_optimizer, *_ = engine.make_private(
            module=model,
            optimizer=optimizer,
            criterion=nn.MSELoss(),  # unused: the trainer hands Opacus its (B,) loss; "mean" must match below
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=cfg.max_grad_norm,
            poisson_sampling=False,  # the loader above already samples that way, reproducibly
            grad_sample_mode=cfg.mode,
            wrap_model=False,
            noise_generator=torch.Generator(device).manual_seed(seed + 1),
            loss_reduction="mean",
        )
    return (
        PrivateTraining(engine, hooks, dp_optimizer, cfg.mode, delta, sigma, sampler.sample_rate),
        dp_optimizer,
        loader,
    )
