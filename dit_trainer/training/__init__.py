"""Training: the loop and its seams (loss function, update strategy, batches), checkpoints, EMA, monitors and
trackers, and the checks of what a run does beyond its model and data. ``training.run.run(cfg, run_dir)`` is the
entry point, ``training.run`` the composition root."""
