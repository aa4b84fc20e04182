#!/usr/bin/env bash
# The GPU check in one command: the CUDA tests, tiny 50-step experiment=dit runs (bf16 and fp16, checkpoint, resume,
# sample grid), the throughput of DiT-XL/2 and PixArt-XL/2 (img/s, peak memory, MFU; batch sweep; compile on/off;
# gradient checkpointing) and FSDP2 on one and on all GPUs, each in its own process. Writes gpu_check.json and
# gpu_check.md into --out (default outputs/gpu_check/<date>/<time>). On a CPU the same rows run at tiny sizes.
#   scripts/gpu_check.sh [--out DIR] [--models pixart_xl_2,dit_xl_2] [--batches 32,64,128] [...]
# Options: python scripts/gpu_check.py --help.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" WANDB_MODE="${WANDB_MODE:-offline}" TOKENIZERS_PARALLELISM=false
exec python scripts/gpu_check.py "$@"
