"""Peak dense bf16 tensor-core FLOP/s of common GPUs (vendor data sheets, without sparsity): the denominator of MFU."""

from __future__ import annotations

# Matched as substrings of torch.cuda.get_device_name(), longest first ("A100" before "A10", "H100 PCIe" before
# "H100"). H100 SXM reports itself as e.g. "NVIDIA H100 80GB HBM3"; the 40/80 GB A100s have the same peak.
PEAK_BF16_TFLOPS = {
    "B200": 2250.0,
    "H200": 989.4,  # SXM
    "H200 NVL": 835.5,  # the 600 W PCIe card
    "GH200": 989.4,
    "H100 PCIe": 756.5,
    "H100 NVL": 835.5,
    "H100": 989.4,  # SXM
    "H800": 989.4,  # SXM
    "H800 PCIe": 756.5,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.1,
    "L40": 181.0,
    "A6000": 154.8,  # RTX A6000
    "A10G": 70.0,  # AWS g5
    "A10": 125.0,
    "L4": 121.0,
    "RTX 4090": 165.2,  # with fp32 accumulation, as autocast uses
    "RTX 3090": 71.0,
    "V100": 125.0,  # fp16 only: V100 has no bf16 tensor cores (bf16 runs emulated, far slower)
}


def peak_flops(device_name: str) -> float | None:
    """Peak bf16 FLOP/s of the GPU called ``device_name``, or None (a CPU, or a card not in the table)."""
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_BF16_TFLOPS[key] * 1e12
    return None


def mfu(images_per_sec: float, train_flops_per_image: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: the forward + backward FLOPs done per second over the device's peak. Recomputation
    (gradient checkpointing) is not counted as work done, as in the PaLM paper's definition."""
    return None if peak is None else images_per_sec * train_flops_per_image / peak
