"""Check that the configured training trains the DiT and nothing else, on one real batch, before a long run.

    python scripts/verify_gradients.py +experiment=shapes [key=value ...]     # the same config as train.py

Prints the trainable/frozen parameters per component, the gradient-flow doctor's report (why a loss would have no
grad_fn, which parameters get no gradient, and how to fix it), gradient norms, and whether two optimizer steps moved
every trainable parameter and left every frozen one bit-identical. Exit code 0 when healthy, 1 otherwise, 2 for a
bad config value. Writes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from dit_trainer.apps.cli import run_train_script
from dit_trainer.apps.verification import verify_training_setup
from dit_trainer.components.build import build_components
from dit_trainer.config import TrainConfig, call_with_sections

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def verify(cfg: TrainConfig) -> tuple[str, int]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.trainer.seed)  # the DiT initialised as the run's would be
    parts = call_with_sections(build_components, cfg, device=device, frozen_dtype=torch.float32)
    report = call_with_sections(verify_training_setup, cfg, parts=parts, device=device)
    return str(report), 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(run_train_script(CONFIG_DIR, sys.argv[1:], verify, __doc__))
