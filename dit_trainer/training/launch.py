"""What the launch gave a run: the accelerator it trains with (``build_accelerator``), a launch that asked for GPUs on
a machine without one refused, and the processes and device described for the start banner.

A launcher of several processes (``accelerate launch --multi_gpu``, a ``distributed_type: MULTI_GPU`` config such as
``accelerate_configs/ddp_8gpu.yaml``, ``torchrun``) on a machine where torch sees no GPU would start that many CPU
processes, each training on a share of the cores. That is what a broken CUDA install, a CPU-only torch wheel on a GPU
node or an empty ``CUDA_VISIBLE_DEVICES`` looks like, so it is refused before anything is built. CPU processes asked
for on purpose run: ``ACCELERATE_USE_CPU=1`` set before the launch (how the tests and CI start them), or an FSDP launch
(``accelerate_configs/fsdp_cpu.yaml``, whose processes the trainer switches to FSDP itself: ``training.parallel.fsdp``).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    DistributedType,
    GradientAccumulationPlugin,
    InitProcessGroupKwargs,
    ProjectConfiguration,
    str_to_bool,
)

from dit_trainer.config import LoggerConfig, TrainerConfig
from dit_trainer.errors import ConfigError
from dit_trainer.precision import refuse_fp16_without_autocast, resolve_mixed_precision
from dit_trainer.training.monitors.trackers import check_trackers, tracker_name
from dit_trainer.training.parallel.fsdp import fsdp_requested, launched_on_cpu_processes, shard_on_cpu_processes

CPU_ON_PURPOSE = "ACCELERATE_USE_CPU"


def cpu_processes_asked_for() -> bool:
    """Whether the launch said its processes are CPU ones (``ACCELERATE_USE_CPU``) or asked for FSDP, whose CPU
    path this trainer supports."""
    return bool(str_to_bool(os.environ.get(CPU_ON_PURPOSE, "false") or "false")) or fsdp_requested()


def check_launch_devices() -> None:
    """Refuse several GPU processes launched on a machine without GPUs (module docstring); read from the
    environment the launcher set, before the accelerator starts."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes <= 1 or not launched_on_cpu_processes() or cpu_processes_asked_for():
        return
    build = f"torch {torch.__version__} is a CPU-only build" if torch.version.cuda is None else "torch sees no GPU"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    raise ConfigError(
        "accelerate launch",
        f"{processes} processes on GPUs",
        f"{build} on this machine{visible}, so each of the {processes} processes would train on a share of "
        f"its {os.cpu_count()} CPU cores",
        "run on a machine with GPUs (check `nvidia-smi` and `python -c 'import torch; print(torch.cuda."
        "is_available())'`), or, to train CPU processes on purpose, set `ACCELERATE_USE_CPU=1` before the launch "
        "(or launch with `accelerate_configs/fsdp_cpu.yaml`)",
    )


def describe_processes(accelerator: Accelerator) -> str:
    """``1 process on cpu (no GPU found)``, ``8 processes (DDP) on cuda: NVIDIA H100 80GB HBM3``, ``2 processes
    (FSDP2) on cpu (gloo)``. FSDP is named even for one process: its checkpoints are sharded, and only an FSDP
    launch resumes them."""
    count = accelerator.num_processes
    kind = {
        DistributedType.FSDP: "FSDP2" if accelerator.is_fsdp2 else "FSDP",
        DistributedType.MULTI_GPU: "DDP",
        DistributedType.MULTI_CPU: "DDP",
    }.get(accelerator.distributed_type)
    named = kind and (count > 1 or accelerator.distributed_type == DistributedType.FSDP)
    processes = f"{count} process{'es' if count > 1 else ''}{f' ({kind})' if named else ''}"
    device = accelerator.device
    if device.type == "cuda":
        where = f"cuda: {torch.cuda.get_device_name(device)}"
    elif device.type == "cpu":
        where = f"cpu ({'gloo; ' if count > 1 else ''}no GPU found)" if not torch.cuda.is_available() else "cpu"
    else:
        where = device.type
    return f"{processes} on {where}"


def build_accelerator(trainer: TrainerConfig, logger: LoggerConfig, run_dir: Path) -> Accelerator:
    """The accelerator of a run, once the launch's devices and the tracker are known to work (refused otherwise)."""
    check_launch_devices()  # several GPU processes launched on a machine without GPUs
    check_trackers(logger)  # its package installed; W&B online with credentials
    mixed_precision = resolve_mixed_precision(trainer.mixed_precision)
    accelerator = Accelerator(
        cpu=launched_on_cpu_processes(),
        mixed_precision=mixed_precision,
        # An update is the step's micro-batches, wherever an epoch ends (accelerate's default syncs at the end of
        # the data loader, which would end an update early and shift every later one).
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=trainer.gradient_accumulation_steps, sync_with_dataloader=False
        ),
        log_with=tracker_name(logger),
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        # The LR schedule counts optimizer updates (the update steps it): accelerate's own stepping advances it once
        # per process, so a checkpoint's schedule would move on a resume with another number of processes.
        step_scheduler_with_optimizer=False,
        # Monitors (sample grids, rewards, FID) run on the main process while the others wait in a collective:
        # NCCL's default 10 minutes would kill a long FID evaluation.
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(minutes=trainer.collective_timeout_minutes))],
    )
    refuse_fp16_without_autocast(trainer.mixed_precision, mixed_precision, accelerator.device.type != "cpu")
    shard_on_cpu_processes(accelerator)
    return accelerator
