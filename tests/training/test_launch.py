"""What the launch gives a run (``training/launch.py``, ``precision.py``): the environment ``accelerate launch`` hands
its processes, computed by accelerate's own launcher code from our configs and flags (no process started), decides
the precision of ``trainer.mixed_precision=auto`` and whether a launch that asked for GPUs is refused on a machine
without one."""

from __future__ import annotations

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.precision import choose_mixed_precision
from dit_trainer.training.launch import check_launch_devices

from ..conftest import REPO, free_port

ACCELERATE_CONFIGS = REPO / "accelerate_configs"  # the example launch configs, outside Hydra's search path
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without GPUs does")


def launched_env(*flags: str, processes: int = 1) -> dict[str, str]:
    """The environment one process of ``accelerate launch <flags> train.py`` gets: accelerate's launcher's own
    (private API, the calls `accelerate launch` makes), plus what torchrun adds for each worker."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    args = _validate_launch_command(launch_command_parser().parse_args([*flags, "train.py"]))[0]
    if not (args.multi_gpu or args.use_fsdp):
        return prepare_simple_launcher_cmd_env(args)[1]
    args.main_process_port = free_port()
    return {**prepare_multi_gpu_env(args), "WORLD_SIZE": str(processes), "LOCAL_RANK": "0", "RANK": "0"}


@pytest.fixture()
def launched(monkeypatch):
    """Put this process in the environment of a launched one."""

    def launch(*flags: str, processes: int = 1) -> None:
        for name in ("ACCELERATE_USE_CPU", "ACCELERATE_USE_FSDP", "LOCAL_RANK", "WORLD_SIZE"):
            monkeypatch.delenv(name, raising=False)
        for name, value in launched_env(*flags, processes=processes).items():
            monkeypatch.setenv(name, value)

    return launch


def test_auto_follows_the_launchers_mixed_precision(launched):
    launched("--num_processes", "1", "--mixed_precision", "bf16")
    precision = choose_mixed_precision("auto")
    assert precision.value == "bf16" and "the launcher's --mixed_precision bf16" in precision.describe()
    explicit = choose_mixed_precision("no")  # the trainer's own setting wins, and says what it overrode
    assert explicit.value == "no" and "overrides the launcher's bf16" in explicit.describe()


@no_gpu
def test_a_launchers_no_leaves_auto_to_the_device(launched):
    launched("--num_processes", "1")  # accelerate writes `no` when given nothing
    assert choose_mixed_precision("auto").value == "no"


def test_an_unsupported_launcher_precision_is_one_paragraph(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    with pytest.raises(ConfigError, match="ACCELERATE_MIXED_PRECISION.*--mixed_precision bf16"):
        choose_mixed_precision("auto")


@no_gpu
def test_a_gpu_launch_config_on_a_machine_without_gpus_is_refused(launched):
    launched("--config_file", str(ACCELERATE_CONFIGS / "ddp_8gpu.yaml"), processes=8)
    with pytest.raises(ConfigError) as refused:
        check_launch_devices()
    message = str(refused.value)
    assert "8 processes on GPUs" in message and "ACCELERATE_USE_CPU=1" in message and "fsdp_cpu.yaml" in message


@no_gpu
@pytest.mark.parametrize(
    "flags",
    [
        ("--config_file", str(ACCELERATE_CONFIGS / "fsdp_cpu.yaml")),  # the README's CPU FSDP launch
        ("--multi_gpu", "--num_processes", "2"),  # with ACCELERATE_USE_CPU=1, as the tests launch CPU processes
        ("--config_file", str(ACCELERATE_CONFIGS / "single_gpu.yaml")),  # one process: it runs, the banner says where
    ],
    ids=["fsdp_cpu", "multi_gpu-use-cpu", "single_gpu"],
)
def test_cpu_processes_asked_for_are_launched(launched, monkeypatch, flags):
    launched(*flags, processes=2)
    if "--multi_gpu" in flags:
        monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    check_launch_devices()
