"""The peak FLOP/s table behind MFU: names as torch.cuda.get_device_name() reports them."""

import pytest

from dit_trainer.apps.gpu_check.peak import mfu, peak_flops


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4),  # SXM
        ("NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H200", 989.4),
        ("NVIDIA H200 NVL", 835.5),  # not the SXM card's
        ("NVIDIA H800 PCIe", 756.5),
        ("NVIDIA GH200 480GB", 989.4),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A10", 125.0),  # not the A100's
        ("NVIDIA L40S", 362.1),
        ("NVIDIA L4", 121.0),  # not the L40's
        ("NVIDIA GeForce RTX 4090", 165.2),
    ],
)
def test_a_known_card_gets_its_dense_bf16_peak(name, tflops):
    assert peak_flops(name) == pytest.approx(tflops * 1e12)


def test_mfu_is_work_done_over_peak_and_unknown_without_a_peak():
    # fast-DiT's anchor: DiT-XL/2 (3 x 2 x 118.6 GFLOP per image) at 107 img/s on an A100 is about 24 %
    assert mfu(107, 3 * 2 * 118.6e9, peak_flops("NVIDIA A100-SXM4-40GB")) == pytest.approx(0.244, abs=0.001)
    assert peak_flops("cpu (x86_64)") is None and mfu(107, 1e9, None) is None
