"""Training: the loop and its seams (objective, update strategy, batches), checkpoints, EMA, monitors and trackers.
``run(cfg, run_dir)`` is the entry point."""

from dit_trainer.training.run import build_trainer, run
from dit_trainer.training.trainer import LoopSettings, Trainer, TrainResult

__all__ = ["LoopSettings", "TrainResult", "Trainer", "build_trainer", "run"]
