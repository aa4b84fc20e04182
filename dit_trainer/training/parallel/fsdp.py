"""FSDP2 through accelerate: the launch on CPU processes, and the FSDP settings this trainer accepts.

The trainer itself is written for sharded weights wherever it reads whole ones (``dit_trainer.sharding``): the
trained parameters, clipping and the EMA are taken after ``prepare``; checkpoints hold accelerate's sharded state
plus whole weights gathered for ``save_pretrained``; monitors sample on every process.
"""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

from dit_trainer.components.dit import DiTAdapter
from dit_trainer.errors import ConfigError

logger = get_logger(__name__)


def launched_on_cpu_processes() -> bool:
    """Processes started by a distributed launcher (torchrun, ``accelerate launch --multi_gpu`` or with an FSDP
    config) on a machine without accelerators. accelerate starts no process group there unless told the processes
    are CPU ones (``ACCELERATE_USE_CPU``, which ``accelerate launch`` sets only for its single-process ``--cpu``
    launcher), so each process would silently train alone."""
    return "LOCAL_RANK" in os.environ and not torch.accelerator.is_available()


def fsdp_requested() -> bool:
    """Whether the launch asked for FSDP (``accelerate launch`` with ``distributed_type: FSDP`` sets this)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def shard_on_cpu_processes(accelerator: Accelerator) -> None:
    """Switch a CPU process group to FSDP when the launch asked for it.

    accelerate 1.15 selects FSDP only for a process group on accelerators: on CPU processes it picks ``MULTI_CPU``
    and drops the FSDP plugin without a word (the model would be DDP-wrapped). torch's FSDP2 runs on gloo, and
    accelerate's FSDP2 path has nothing device-specific once its state says FSDP, so this sets it. Both shared
    states: ``AcceleratorState`` copies ``PartialState``'s type again whenever it is instantiated (e.g. by
    ``AcceleratedOptimizer``), and a save would then take the unsharded path.
    """
    if not fsdp_requested() or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    plugin = FullyShardedDataParallelPlugin()  # from the FSDP_* variables the launch set
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state.update(distributed_type=DistributedType.FSDP, fsdp_plugin=plugin)


def check_fsdp(accelerator: Accelerator) -> None:
    """FSDP2 only: FSDP1 flattens the parameters into 1-D shards that the EMA and the whole-weight checkpoints cannot
    read, and its full state dict (``rank0_only``) crashes on CPU processes."""
    if accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2:
        raise ConfigError(
            "fsdp_config.fsdp_version",
            1,
            "this trainer shards with FSDP2 (`fully_shard`, one DTensor slice per parameter); FSDP1's flattened "
            "parameters do not fit its EMA and whole-weight checkpoints",
            "set `fsdp_version: 2` in the accelerate config (as `accelerate_configs/fsdp.yaml` does) or launch "
            "with `--fsdp_version 2`",
        )


def wrap_family_blocks(accelerator: Accelerator, dit: DiTAdapter) -> None:
    """Make the family's repeated blocks (``Family.blocks``) FSDP's wrap units when the accelerate config names
    none, or classes this model does not have (``accelerate_configs/fsdp.yaml`` names PixArt's and DiT's
    ``BasicTransformerBlock``; SD3, Flux and Sana have their own). Without units the whole model would be one,
    gathered whole for every forward.

    The modules the family shares between blocks (``Family.shared``: the DiT's embedder) become units of their own
    too. accelerate shards bottom-up, so such a module is sharded before the first block that holds it: inside that
    block's unit it would stay sharded for every other caller, and the next block's ``fully_shard`` would take its
    DTensors for tensor-parallel ones (``TypeError: Invariant encountered: value was None``)."""
    if not accelerator.is_fsdp2:
        return
    plugin = accelerator.state.fsdp_plugin
    shared = sorted({type(module).__name__ for module in dit.shared_modules()})
    if plugin.auto_wrap_policy is size_based_auto_wrap_policy and shared:
        raise ConfigError(
            "fsdp_config.fsdp_auto_wrap_policy",
            "SIZE_BASED_WRAP",
            f"{type(dit.transformer).__name__}'s blocks share {', '.join(shared)}: size-based units would put it "
            "inside whichever block is sharded first, where the other blocks cannot use it",
            "set `fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP` (as `accelerate_configs/fsdp.yaml` does): the "
            "trainer then wraps the blocks and the shared modules as units of their own",
        )
    if plugin.auto_wrap_policy is not transformer_auto_wrap_policy:
        return
    named = plugin.transformer_cls_names_to_wrap or []
    blocks = sorted({type(block).__name__ for block in dit.blocks()})
    if named and set(named) <= {type(module).__name__ for module in dit.modules()}:
        blocks = named
    elif named:
        logger.warning(
            f"The accelerate config wraps {', '.join(named)}, which {type(dit.transformer).__name__} does not "
            f"have; FSDP wraps its blocks instead: {', '.join(blocks)}.",
            main_process_only=True,
        )
    plugin.transformer_cls_names_to_wrap = [*blocks, *(name for name in shared if name not in blocks)]


def gather_shared_modules_once(dit: DiTAdapter) -> None:
    """Keep each shared module's unit (``wrap_family_blocks``) gathered from its first call in a forward until its
    gradient is reduced at the end of the backward: one all-gather a step where resharding after each call would
    gather it again for every caller (29 times a forward for DiT-XL/2). ``dit``: the prepared model, unwrapped."""
    for module in dit.shared_modules():
        if isinstance(module, FSDPModule):
            module.set_reshard_after_forward(False, recurse=False)
