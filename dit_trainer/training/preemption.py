"""Preemption: SIGTERM (what schedulers send before killing a job) and SIGUSR1 (Slurm's ``--signal=USR1@N``
warning) ask the trainer to stop cleanly: finish the current optimizer step, write a checkpoint, flush the
trackers, and exit with ``errors.EXIT_PREEMPTED`` so the job script knows to requeue with ``trainer.resume=latest``."""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionHandler:
    """A context that turns ``STOP_SIGNALS`` into a flag the training loop polls between steps.

    The previous handlers come back on exit. A second signal while a stop is pending is ignored: the checkpoint in
    progress matters more than stopping a second earlier.
    """

    def __init__(self) -> None:
        self.requested: signal.Signals | None = None
        self._previous: dict[signal.Signals, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = self.requested or signal.Signals(signum)

    def __enter__(self) -> PreemptionHandler:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
