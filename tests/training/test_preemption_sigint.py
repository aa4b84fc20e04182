"""Ctrl-C (SIGINT) asks the loop to stop like SIGTERM, marked as the user's stop (exit 130, not a requeue); the
launcher's copy of the same Ctrl-C is not a second one; a second Ctrl-C stops at once; data loader workers forked
inside the handler leave the decision to their main process."""

from __future__ import annotations

import os
import signal
import time

import pytest

from dit_trainer.training import preemption
from dit_trainer.training.preemption import PreemptionHandler


def send(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.01)  # Python runs the handler between bytecodes of the main thread: let it


def send_ctrl_c() -> None:
    """A Ctrl-C the handler must take (not one that would end the test session)."""
    try:
        send(signal.SIGINT)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C raised KeyboardInterrupt instead of asking for a stop")


def test_ctrl_c_asks_for_a_stop_says_how_to_stop_at_once_and_is_the_users(capfd):
    before = signal.getsignal(signal.SIGINT)  # Python's default; ignored in a shell's background job
    with PreemptionHandler() as handler:
        send_ctrl_c()
        send_ctrl_c()  # `accelerate launch` forwarding the terminal's Ctrl-C right after it: the same one
        assert handler.requested == signal.SIGINT and handler.interrupted
    assert "press Ctrl-C again to stop at once" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) == before


def test_a_second_ctrl_c_stops_at_once(monkeypatch):
    monkeypatch.setattr(preemption, "REPEAT_SECONDS", 0.0)
    with PreemptionHandler() as handler:
        send_ctrl_c()
        assert handler.requested == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            send(signal.SIGINT)


def test_sigterm_is_a_preemption_not_an_interruption():
    with PreemptionHandler() as handler:
        send(signal.SIGTERM)
        send_ctrl_c()  # a Ctrl-C while the preemption's checkpoint is pending: still the scheduler's stop
        assert handler.requested == signal.SIGTERM and not handler.interrupted


def test_a_forked_worker_ignores_ctrl_c(monkeypatch):
    monkeypatch.setattr(preemption, "REPEAT_SECONDS", 0.0)
    with PreemptionHandler() as handler:
        pid = os.fork()
        if pid == 0:  # the worker: Ctrl-C twice, past the repeat window; exit 0 only if both were ignored
            try:
                send(signal.SIGINT)
                send(signal.SIGINT)
                os._exit(1 if handler.requested else 0)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and handler.requested is None
