"""Training: the loop and its seams (objective, update strategy, batches), checkpoints, EMA, monitors and trackers.
``dit_trainer.training.run.run(cfg, run_dir)`` is the entry point. (The package does not import it: the composition
root imports the GRPO trainer, which subclasses the loop defined here.)"""

from dit_trainer.training.trainer import LoopSettings, Trainer, TrainResult

__all__ = ["LoopSettings", "TrainResult", "Trainer"]
