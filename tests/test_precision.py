"""Precision per device (``precision.py``): TF32 for a GPU's float32 matmuls, nothing changed on a CPU; fp16 on a
CPU refused."""

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.precision import LAUNCHER_PRECISION, allow_tf32, choose_mixed_precision, weight_dtype


@pytest.fixture()
def tf32_flags():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_tf32_is_allowed_for_a_gpu_and_left_alone_on_a_cpu(tf32_flags):
    allow_tf32(torch.device("cpu"))
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    allow_tf32(torch.device("cuda", 0))
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


def test_frozen_components_take_the_half_precision_of_the_run():
    assert weight_dtype("bf16") == torch.bfloat16 and weight_dtype("fp16") == torch.float16
    assert weight_dtype("no") == torch.float32


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="a machine without a GPU")
@pytest.mark.parametrize("launcher", [None, "fp16"])
def test_fp16_on_a_cpu_is_refused_naming_fp32_and_bf16(monkeypatch, launcher):
    """accelerate has no fp16 autocast or grad scaler on a CPU: the DiT would train in fp32 beside fp16 encoders."""
    requested = "auto" if launcher else "fp16"
    if launcher:
        monkeypatch.setenv(LAUNCHER_PRECISION, launcher)
    with pytest.raises(ConfigError, match=r"is 'fp16'.*no CUDA GPU.*`trainer.mixed_precision=no`.*`bf16`"):
        choose_mixed_precision(requested)
    assert choose_mixed_precision("bf16").value == "bf16"
