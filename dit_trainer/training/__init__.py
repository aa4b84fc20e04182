"""Training: the loop and its seams (a method's step, the update strategy and sequence), checkpoints, EMA, monitors
and trackers, and the checks of what a run does beyond its model and data. The composition root that builds a run
from its config is above this package: ``dit_trainer.assemble``."""
