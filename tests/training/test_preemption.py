"""Preemption (``training/preemption.py``): SIGTERM and SIGUSR1 become a flag, and the handlers are put back."""

import os
import signal

import pytest

from dit_trainer.training.preemption import PreemptionHandler


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX signals")
def test_the_preemption_handler_turns_signals_into_a_flag_and_restores_handlers():
    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionHandler() as handler:
        assert handler.requested is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert handler.requested == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal keeps the first reason
        assert handler.requested == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) == before
