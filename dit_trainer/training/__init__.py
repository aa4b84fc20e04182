"""Training: the loop, checkpoints, EMA, monitors and trackers. ``run(cfg, run_dir)`` is the entry point."""

from dit_trainer.training.run import run
from dit_trainer.training.trainer import GradientFlowError, NonFiniteError, Trainer, TrainResult

__all__ = ["GradientFlowError", "NonFiniteError", "TrainResult", "Trainer", "run"]
