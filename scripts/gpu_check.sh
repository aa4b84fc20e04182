#!/usr/bin/env bash
# The GPU check, in calls that each fit a time budget (a lent GPU machine takes commands of at most ~10 minutes):
#   scripts/gpu_check.sh --out outputs/gpu_check/h100 --budget 540    # repeat until it says every row is measured
#   scripts/gpu_check.sh --plan --plan-for "NVIDIA H100 80GB HBM3"     # the rows, their estimates and the calls
# Installs what it needs first on a bare machine (scripts/install.sh test: an installed CUDA torch is kept), then
# measures: the CUDA tests, tiny bf16/fp16 runs trained, resumed and sampled, the throughput of DiT-XL/2 and
# PixArt-XL/2 (eager, compiled, checkpointed) and FSDP2. Writes gpu_check.json and gpu_check.md into --out.
# Options: python scripts/gpu_check.py --help.
set -euo pipefail
cd "$(dirname "$0")/.."
export GPU_CHECK_STARTED="${GPU_CHECK_STARTED:-$(date +%s)}"  # the install's time counts against --budget too
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" WANDB_MODE="${WANDB_MODE:-offline}" TOKENIZERS_PARALLELISM=false
# (importable from the repository without an install, so ask for the installed distribution and its test extras)
if ! python -c "import importlib.metadata as m; m.version('dit-trainer'); import pytest, diffusers, hydra" 2>/dev/null; then
    echo "Installing dit-trainer and its test extras (scripts/install.sh test) ..."
    bash scripts/install.sh test
fi
exec python scripts/gpu_check.py "$@"
