"""What the GPU check runs on, asked of the driver rather than of torch: a GPU the driver sees but torch cannot use
(a CPU wheel, or a CUDA build newer than the driver) stops the check with the fix, instead of a quiet CPU run that
reports ``device: cpu`` and spends the machine's time; and the parent process names the card without creating a
CUDA context of its own, which would hold ~0.5 GB through every row."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from dit_trainer.apps.gpu_check.peak import peak_flops

# CUDA versions PyTorch publishes wheels for (download.pytorch.org/whl/cuXYZ), newest last.
TORCH_CUDA_TAGS = ("11.8", "12.1", "12.4", "12.6", "12.8", "12.9", "13.0")


class UnusableGPUError(RuntimeError):
    """The driver sees a GPU that this torch cannot use; the message names both and the install that fixes it."""


@dataclass(frozen=True)
class Driver:
    """What ``nvidia-smi`` reports: the cards' names, the driver's version and the newest CUDA it runs."""

    gpus: tuple[str, ...]
    version: str
    cuda: str  # e.g. "13.0"; "" when nvidia-smi does not say
    capability: str = ""  # the first GPU's compute capability, e.g. "9.0"


def nvidia_driver() -> Driver | None:
    """The driver's report, or None where there is no ``nvidia-smi`` (or it fails: no driver loaded)."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = _query_gpus("name,driver_version,compute_cap") or _query_gpus("name,driver_version")  # older drivers
    if query is None:
        return None
    try:
        banner = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        banner = ""
    rows = [[cell.strip() for cell in line.split(",")] for line in query.splitlines() if line.strip()]
    cuda = re.search(r"CUDA Version:\s*([0-9.]+)", banner)
    first = rows[0] + ["", ""] if rows else ["", "", ""]
    return Driver(tuple(row[0] for row in rows), first[1], cuda.group(1) if cuda else "", first[2])


def _query_gpus(fields: str) -> str | None:
    """``nvidia-smi --query-gpu=FIELDS``'s CSV, or None when it fails (no driver loaded, a field it does not know)."""
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=60, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None


def _hidden_on_purpose() -> bool:
    """``CUDA_VISIBLE_DEVICES=""`` (or -1): the user asked for the CPU, so the CPU mode is what they get."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible is not None and visible.strip() in ("", "-1")


def wheel_tag(driver_cuda: str) -> str:
    """The newest of PyTorch's CUDA wheel tags (``cu128``) that a driver running ``driver_cuda`` can load."""

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("."))

    fitting = [tag for tag in TORCH_CUDA_TAGS if not driver_cuda or version(tag) <= version(driver_cuda)]
    return "cu" + (fitting or TORCH_CUDA_TAGS[:1])[-1].replace(".", "")


def require_usable_gpu(driver: Driver | None) -> None:
    """Stop when the driver sees a GPU and this torch cannot use it (unless the GPUs were hidden on purpose)."""
    if driver is None or not driver.gpus or torch.cuda.is_available() or _hidden_on_purpose():
        return
    build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    release = torch.__version__.split("+")[0]
    tag = wheel_tag(driver.cuda)
    raise UnusableGPUError(
        f"The driver sees {len(driver.gpus)} GPU(s) ({driver.gpus[0]}; driver {driver.version}, CUDA "
        f"{driver.cuda or 'unknown'}) but torch {torch.__version__} ({build}) cannot use them, so the check would "
        f"measure the CPU and report it as this machine. To fix it, install a torch built for a CUDA the driver runs, "
        f"e.g. `pip install --force-reinstall torch=={release} --index-url https://download.pytorch.org/whl/{tag}`, "
        f"then run the check again; to measure the CPU on purpose, set `CUDA_VISIBLE_DEVICES=`."
    )


def compiler_missing() -> str:
    """Why ``torch.compile`` cannot build its kernels here ('' when it can): Triton (GPU) and inductor's C++ (CPU)
    compile with a C compiler against Python's headers, and slim images lack either; found out after a row's
    imports and model build otherwise."""
    compiler = os.environ.get("CC", "gcc")
    if shutil.which(compiler) is None and shutil.which("cc") is None:
        return f"no C compiler ({compiler}, cc) on PATH: install one (e.g. `apt-get install -y gcc`)"
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.is_file():
        return f"no {header}: install Python's headers (e.g. `apt-get install -y python3-dev`)"
    return ""


def machine(driver: Driver | None) -> dict:
    """What the numbers are measured on: the card named by the driver where torch can use it (no CUDA context in
    this process), else the CPU."""
    cuda = torch.cuda.is_available()
    name = driver.gpus[0] if cuda and driver and driver.gpus else None
    cpu = f"cpu ({platform.processor() or platform.machine()})"
    return {
        "device": name or (f"cuda ({torch.cuda.device_count()} devices)" if cuda else cpu),
        "gpus": torch.cuda.device_count() if cuda else 0,
        "peak_bf16_flops": peak_flops(name) if name else None,
        "driver": driver.version if driver else None,
        "compute_capability": driver.capability if cuda and driver else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
    }
