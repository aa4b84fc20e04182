"""Precision per device (``precision.py``): TF32 for a GPU's float32 matmuls, nothing changed on a CPU; fp16 on a
CPU processes refused."""

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.precision import LAUNCHER_PRECISION, allow_tf32, refuse_fp16_without_autocast, weight_dtype


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


@pytest.mark.parametrize(("requested", "key"), [("fp16", "trainer.mixed_precision"), ("auto", LAUNCHER_PRECISION)])
def test_fp16_without_accelerate_s_autocast_is_refused_naming_where_it_came_from(requested, key):
    """CPU processes (no GPU, or ``ACCELERATE_USE_CPU=1``) get no fp16 autocast or grad scaler from accelerate: the
    DiT would train in fp32 beside fp16 encoders."""
    with pytest.raises(ConfigError, match=rf"`{key}` is 'fp16'.*on the CPU.*`trainer.mixed_precision=no`.*`bf16`"):
        refuse_fp16_without_autocast(requested, "fp16", autocasts=False)
    refuse_fp16_without_autocast(requested, "fp16", autocasts=True)  # a GPU process
    refuse_fp16_without_autocast(requested, "bf16", autocasts=False)  # CPU autocast has bf16
