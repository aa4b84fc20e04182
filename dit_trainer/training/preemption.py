"""Stopping cleanly on a signal: SIGTERM (what schedulers send before killing a job), SIGUSR1 (Slurm's
``--signal=USR1@N`` warning) and SIGINT (Ctrl-C) ask the trainer to finish the current optimizer step, write a
checkpoint, flush the trackers and exit: with ``errors.EXIT_PREEMPTED`` after SIGTERM/SIGUSR1, so that the job
script requeues, and with ``errors.EXIT_INTERRUPTED`` (130, the shell's code for Ctrl-C) after SIGINT, which a job
script must not take for a preemption. A second Ctrl-C stops at once, without that checkpoint: it raises
``KeyboardInterrupt``, which ``train.py`` turns into one line and exit 130; a checkpoint write it cuts short never
becomes a checkpoint (it is written to a ``.partial`` folder and renamed when complete)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# A Ctrl-C this soon after the first is the same one: `accelerate launch` / torchrun forward the terminal's SIGINT to
# the training processes, which the terminal has already sent it to (they are in its process group).
REPEAT_SECONDS = 1.5
FIRST_CTRL_C = (
    b"\nCtrl-C: stopping after this step with a checkpoint (press Ctrl-C again to stop at once, without one)\n"
)


class PreemptionHandler:
    """A context that turns ``STOP_SIGNALS`` into a flag the training loop polls between steps.

    The previous handlers come back on exit. A second SIGTERM or SIGUSR1 while a stop is pending is ignored: the
    checkpoint in progress matters more than stopping a second earlier. A second Ctrl-C is the user's "now". Data
    loader workers forked inside the context inherit the handler and ignore the signals: the main process stops
    them.
    """

    def __init__(self) -> None:
        self.requested: signal.Signals | None = None
        self._previous: dict[signal.Signals, object] = {}
        self._pid = os.getpid()
        self._first_ctrl_c: float | None = None

    @property
    def interrupted(self) -> bool:
        """Whether the stop was asked for with Ctrl-C (exit 130 rather than a requeue's 3)."""
        return self.requested == signal.SIGINT

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a data loader worker: its main process decides
            return
        received = signal.Signals(signum)
        if received == signal.SIGINT:
            now = time.monotonic()
            if self._first_ctrl_c is None:
                self._first_ctrl_c = now
                if os.environ.get("RANK", "0") == "0":  # once per launch; not print: it may interrupt a write
                    with contextlib.suppress(OSError):  # no stderr (closed): the stop still happens
                        os.write(2, FIRST_CTRL_C)
            elif now - self._first_ctrl_c > REPEAT_SECONDS:
                raise KeyboardInterrupt
        self.requested = self.requested or received

    def __enter__(self) -> PreemptionHandler:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
