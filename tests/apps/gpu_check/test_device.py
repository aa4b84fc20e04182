"""The device the check measures, asked of the driver: a GPU that the driver sees and torch cannot use stops the
check with one paragraph naming both and the install that fixes it (it ran its CPU mode and reported `device: cpu`);
the card's name comes from the driver, not from a CUDA context in the parent."""

import runpy
import stat

import pytest
import torch

from dit_trainer.apps.gpu_check.device import (
    UnusableGPUError,
    compiler_missing,
    machine,
    nvidia_driver,
    require_usable_gpu,
    wheel_tag,
)
from tests.conftest import REPO

needs_cpu_torch = pytest.mark.skipif(torch.cuda.is_available(), reason="what a torch that cannot use the GPU does")
BANNER = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 12.8     |
+-----------------------------------------------------------------------------------------+"""


@pytest.fixture
def driver_with_a_gpu(tmp_path, monkeypatch):
    """An ``nvidia-smi`` on PATH that reports one H100 (the real binary's output formats)."""
    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(f"""#!/bin/sh
if [ "$1" = "--query-gpu=name,driver_version,compute_cap" ]; then
    echo "NVIDIA H100 80GB HBM3, 580.159.04, 9.0"; exit 0
fi
cat <<'END'
{BANNER}
END
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_the_driver_report_is_read_from_nvidia_smi(driver_with_a_gpu):
    driver = nvidia_driver()
    assert driver is not None and driver.gpus == ("NVIDIA H100 80GB HBM3",)
    assert (driver.version, driver.cuda, driver.capability) == ("580.159.04", "12.8", "9.0")


@needs_cpu_torch
def test_a_gpu_torch_cannot_use_stops_the_check_with_the_install_that_fixes_it(driver_with_a_gpu, capsys):
    with pytest.raises(UnusableGPUError) as caught:
        require_usable_gpu(nvidia_driver())
    message = str(caught.value)
    assert "\n" not in message and torch.__version__ in message and "580.159.04" in message and "12.8" in message
    release = torch.__version__.split("+")[0]
    assert f"torch=={release} --index-url https://download.pytorch.org/whl/cu128" in message  # the driver's CUDA
    check = runpy.run_path(str(REPO / "scripts" / "gpu_check.py"))["check"]
    assert check(["--plan"]) == 2  # the script: exit 2 before any plan or row
    err = capsys.readouterr().err
    assert err.startswith("error: The driver sees 1 GPU(s)") and err.count("\n") == 1


@needs_cpu_torch
def test_gpus_hidden_on_purpose_or_no_driver_give_the_cpu_mode(driver_with_a_gpu, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    require_usable_gpu(nvidia_driver())
    require_usable_gpu(None)  # no nvidia-smi: a CPU machine
    assert machine(None)["device"].startswith("cpu (") and machine(None)["peak_bf16_flops"] is None


@pytest.mark.parametrize(("driver_cuda", "tag"), [("13.0", "cu130"), ("12.8", "cu128"), ("12.7", "cu126"),
                                                  ("12.2", "cu121"), ("", "cu130")])  # fmt: skip
def test_the_wheel_named_is_the_newest_the_driver_can_load(driver_cuda, tag):
    assert wheel_tag(driver_cuda) == tag


def test_a_machine_without_a_c_compiler_says_which_and_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-cc")
    assert "no C compiler (no-such-cc, cc)" in compiler_missing()
