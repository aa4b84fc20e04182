"""What a run needs of device memory per process, said before step 1 and, on a GPU, checked against it: the
weights of every model on the device, the trained parameters' gradients, the optimizer's state (AdamW's two
float32 moments, or what another ``optim.name`` keeps) and the EMA, the copies DDP and autocast keep, and the
activations one image keeps for backward, measured on a meta copy of the DiT at the run's latent shape. A run that
cannot fit is refused before it loads data or takes a step, with the batch that would fit, instead of failing with
CUDA's out-of-memory error at step 1."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DistributedType
from torch import nn

from dit_trainer.components.build import Components
from dit_trainer.components.freeze import trainable_parameters
from dit_trainer.components.meta import Activations, meta_copy, meta_inputs, saved_activations
from dit_trainer.config import TrainerConfig
from dit_trainer.errors import ConfigError
from dit_trainer.precision import weight_dtype
from dit_trainer.training.optimizers import OPTIMIZER_CHOICES

logger = get_logger(__name__)

GiB, MiB = 2**30, 2**20
SELECTIVE = 2  # the selective checkpointing a refusal suggests: every 2nd block recomputed
COMPILED_NOTE = (
    "Not refused under `trainer.compile=true`: the estimate counts what eager blocks keep for backward, and compiled "
    "ones keep less (DiT-XL/2 at 256 px: about two thirds, measured on an H200), so this batch may still fit."
)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per process. ``activations``: per image of the batch (``Activations.whole``, or ``.checkpointed(k)``
    with ``trainer.gradient_checkpointing``, every k-th block); the rest does not depend on the batch. Where a
    method takes ``checkpointing``, it is 0 for none and k for every k-th block."""

    weights: int  # the DiT (float32 master weights) and the frozen VAE and text encoder, as loaded
    gradients: int  # one per trained parameter
    optimizer: int  # AdamW's two moments per trained parameter
    ema: int  # the float32 shadow of each trained parameter
    copies: int  # DDP's gradient buckets (several processes), autocast's low-precision weights (mixed precision)
    activations: Activations

    @property
    def static(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.ema + self.copies

    def per_image(self, checkpointing: int) -> int:
        return self.activations.checkpointed(checkpointing) if checkpointing else self.activations.whole

    def total(self, batch_size: int, checkpointing: int) -> int:
        return self.static + batch_size * self.per_image(checkpointing)

    def largest_batch(self, device_bytes: int, checkpointing: int) -> int:
        """The largest per-process batch that fits ``device_bytes`` (0: not even one image)."""
        return max(0, (device_bytes - self.static) // max(1, self.per_image(checkpointing)))


def tensor_bytes(module: object) -> int:
    """The bytes of ``module``'s parameters and buffers (0 for what is no module: a cache of embeddings)."""
    if not isinstance(module, nn.Module):
        return 0
    return sum(tensor.nbytes for tensor in itertools.chain(module.parameters(), module.buffers()))


def per_image_activations(parts: Components, autocast: tuple[str, torch.dtype] | None) -> Activations:
    """What one more image of the batch keeps for backward: two images' saves less one's, so that what a forward
    keeps whatever its batch (autocast's weight casts, a fused projection's concatenated weights) is not counted
    once per image."""
    model = meta_copy(parts.dit)
    one, two = (saved_activations(model, meta_inputs(parts, batch), autocast) for batch in (1, 2))
    return two - one


def estimate_memory(
    parts: Components,
    ema: bool,
    compute_dtype: torch.dtype,
    ddp: bool = False,
    shards: int = 1,
    optimizer: str = "adamw",
    device_type: str = "cuda",
) -> MemoryEstimate:
    """The estimate for ``parts`` trained with ``optimizer`` (an ``optim.name``; ``ema``: with an EMA) in
    ``compute_dtype`` (bf16/fp16 under mixed precision: the activations are measured under the casts ``device_type``'s
    autocast makes, float32 master weights and all).
    ``ddp``: several processes each keep a copy of the gradients in DDP's buckets; ``shards``: FSDP's processes, over
    which the DiT's weights, gradients, optimizer state and EMA are split."""
    trained = sum(parameter.nbytes for parameter in trainable_parameters(parts.dit.transformer))
    dit = tensor_bytes(parts.dit)
    casts = sum(parameter.numel() for parameter in parts.dit.parameters()) * compute_dtype.itemsize
    autocast = (device_type, compute_dtype) if compute_dtype != torch.float32 else None
    return MemoryEstimate(
        weights=dit // shards + tensor_bytes(parts.vae) + tensor_bytes(parts.text_encoder),
        gradients=trained // shards,
        optimizer=int(OPTIMIZER_CHOICES[optimizer].state_per_parameter_byte * trained) // shards,
        ema=trained // shards if ema else 0,
        copies=(trained if ddp else 0) + (casts if autocast else 0),
        activations=per_image_activations(parts, autocast),
    )


def checkpointing_of(trainer: TrainerConfig) -> int:
    """0 without gradient checkpointing, else k: every k-th block recomputed."""
    return trainer.gradient_checkpointing_every if trainer.gradient_checkpointing else 0


def check_fits(
    estimate: MemoryEstimate, batch_size: int, checkpointing: int, device_bytes: int, compiled: bool = False
) -> None:
    """Refuse a run whose estimate exceeds ``device_bytes`` (a GPU's whole memory: the estimate leaves out the CUDA
    context and the allocator's slack, so what it refuses cannot fit), naming what would fit: fewer images with
    gradient accumulation (no recomputation), then selective checkpointing, then checkpointing every block.
    ``checkpointing``: 0, or every k-th block. ``compiled`` (``trainer.compile``): the same paragraph as a warning,
    since the activations are eager's, an upper bound for compiled blocks, which may fit."""
    try:
        _check_fits(estimate, batch_size, checkpointing, device_bytes)
    except ConfigError as unfit:
        if not compiled:
            raise
        logger.warning(f"{unfit}\n{COMPILED_NOTE}", main_process_only=True)


def _check_fits(estimate: MemoryEstimate, batch_size: int, checkpointing: int, device_bytes: int) -> None:
    need = estimate.total(batch_size, checkpointing)
    if need <= device_bytes:
        return
    fits, fits_checkpointed = (estimate.largest_batch(device_bytes, c) for c in (checkpointing, 1))
    if fits_checkpointed == 0:
        fix = (
            f"the weights, gradients, optimizer state and EMA alone need {estimate.static / GiB:.1f} GiB: train LoRA "
            "adapters (`lora.enabled=true`), shard the model with FSDP (`accelerate launch --config_file "
            "accelerate_configs/fsdp.yaml`), turn the EMA off (`trainer.ema_decay=0`) or use a larger GPU"
        )
    else:
        options = []
        if fits:
            steps = -(-batch_size // fits)
            keep = (
                f" with `trainer.gradient_accumulation_steps={steps}` to keep the images per step" if steps > 1 else ""
            )
            options.append(f"`trainer.batch_size={fits}`{keep}")
        fits_selective = estimate.largest_batch(device_bytes, SELECTIVE)
        if fits_selective >= batch_size and checkpointing not in (1, SELECTIVE):
            options.append(f"`trainer.gradient_checkpointing=true trainer.gradient_checkpointing_every={SELECTIVE}` "
                           f"(fits {fits_selective} images)")  # fmt: skip
        if checkpointing != 1:
            options.append(f"`trainer.gradient_checkpointing=true` (fits {fits_checkpointed} images)")
        fix = "set " + " or ".join(options)
    raise ConfigError(
        "trainer.batch_size",
        batch_size,
        f"this run needs about {need / GiB:.1f} GiB per process ({describe(estimate)}; at this batch "
        f"{batch_size * estimate.per_image(checkpointing) / GiB:.1f} GiB of activations"
        f"{' with gradient checkpointing' if checkpointing else ''}) and the GPU has {device_bytes / GiB:.1f} GiB",
        fix,
    )


def describe(estimate: MemoryEstimate) -> str:
    """The estimate's parts in one line."""
    parts = [
        ("weights", estimate.weights),
        ("gradients", estimate.gradients),
        ("optimizer", estimate.optimizer),
        ("EMA", estimate.ema),
        ("DDP/autocast copies", estimate.copies),
    ]
    fixed = ", ".join(f"{name} {size / GiB:.2f} GiB" for name, size in parts)
    activations = estimate.activations
    return (
        f"{fixed}; activations {activations.whole / MiB:.1f} MiB per image "
        f"({activations.checkpointed(1) / MiB:.1f} MiB with gradient checkpointing, "
        f"{activations.checkpointed(SELECTIVE) / MiB:.1f} MiB with every {SELECTIVE}nd block checkpointed)"
    )


def report_memory(
    trainer: TrainerConfig, optimizer: str, parts: Components, accelerator: Accelerator, refuse_unfit: bool = True
) -> MemoryEstimate:
    """Log the estimate once (``optimizer``: ``optim.name``, whose state it counts); on a GPU with ``refuse_unfit``,
    refuse a run that cannot fit it. Without (a method whose forwards take batches of its own, not
    ``trainer.batch_size``) it is only logged."""
    sharded = accelerator.distributed_type == DistributedType.FSDP
    estimate = estimate_memory(
        parts,
        ema=trainer.ema_decay > 0,
        compute_dtype=weight_dtype(accelerator.mixed_precision),
        ddp=accelerator.num_processes > 1 and not sharded,
        shards=accelerator.num_processes if sharded else 1,
        optimizer=optimizer,
        device_type=accelerator.device.type,
    )
    t = trainer
    total = estimate.total(t.batch_size, checkpointing_of(t)) / GiB
    at = f"at trainer.batch_size={t.batch_size}: {total:.2f} GiB" if refuse_unfit else "(the method's own batches)"
    logger.info(f"Memory per process (estimate): {describe(estimate)}; {at}", main_process_only=True)
    if accelerator.device.type == "cuda" and refuse_unfit:
        device_bytes = torch.cuda.mem_get_info(accelerator.device)[1]
        check_fits(estimate, t.batch_size, checkpointing_of(t), device_bytes, compiled=t.compile)
    return estimate
