"""What the launch gave a run: a launch that asked for GPUs on a machine without one is refused, and the processes
and device are described for the start banner.

A launcher of several processes (``accelerate launch --multi_gpu``, a ``distributed_type: MULTI_GPU`` config such as
``accelerate_configs/ddp_8gpu.yaml``, ``torchrun``) on a machine where torch sees no GPU would start that many CPU
processes, each training on a share of the cores. That is what a broken CUDA install, a CPU-only torch wheel on a GPU
node or an empty ``CUDA_VISIBLE_DEVICES`` looks like, so it is refused before anything is built. CPU processes asked
for on purpose run: ``ACCELERATE_USE_CPU=1`` set before the launch (how the tests and CI start them), or an FSDP launch
(``accelerate_configs/fsdp_cpu.yaml``, whose processes the trainer switches to FSDP itself: ``training.parallel.fsdp``).
"""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, str_to_bool

from dit_trainer.errors import ConfigError
from dit_trainer.training.parallel.fsdp import fsdp_requested, launched_on_cpu_processes

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
    (FSDP2) on cpu (gloo)``."""
    count = accelerator.num_processes
    kind = {
        DistributedType.FSDP: "FSDP2" if accelerator.is_fsdp2 else "FSDP",
        DistributedType.MULTI_GPU: "DDP",
        DistributedType.MULTI_CPU: "DDP",
    }.get(accelerator.distributed_type)
    processes = f"{count} process{'es' if count > 1 else ''}{f' ({kind})' if kind and count > 1 else ''}"
    device = accelerator.device
    if device.type == "cuda":
        where = f"cuda: {torch.cuda.get_device_name(device)}"
    elif device.type == "cpu":
        where = f"cpu ({'gloo; ' if count > 1 else ''}no GPU found)" if not torch.cuda.is_available() else "cpu"
    else:
        where = device.type
    return f"{processes} on {where}"
