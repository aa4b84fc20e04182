"""Precision per device (``precision.py``): TF32 for a GPU's float32 matmuls, nothing changed on a CPU."""

import pytest
import torch

from dit_trainer.precision import allow_tf32, weight_dtype


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
