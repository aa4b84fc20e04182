"""Training: the loop and its seams (a method's step, the update strategy and sequence: ``trainer``, ``step``,
``update``, ``supervised``), and the checks of what a run does beyond its model and data; in sub-folders, what a
checkpoint holds and a resume allows (``state/``: checkpoints, their manifest, the EMA), how a step spreads over
processes and memory (``parallel/``: FSDP2, DP-SGD, the memory estimate) and what watches a run (``monitors/``:
sample grids, rewards, validation, FID, trackers). The composition root that builds a run from its config is above
this package: ``dit_trainer.assemble``."""
