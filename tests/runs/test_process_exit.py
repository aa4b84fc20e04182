"""A process of a multi-process launch ends within bounded time once its run is over (``process_exit``): its exit
handlers run, the interpreter's finalization (where gloo and autograd threads can hang) is skipped, and a handler
that hangs is ended with every thread's stack."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

# A module-level object whose finalizer never returns: it stands for a C++ thread that blocks the interpreter's
# teardown. ``sys.exit`` finalizes the interpreter and hangs on it; ``exit_without_finalizing`` does not.
SCRIPT = textwrap.dedent("""
    import atexit, pathlib, sys, time
    from dit_trainer.runs.process_exit import exit_without_finalizing

    class HangsWhenFinalized:
        def __del__(self):
            time.sleep(3600)

    blocker = HangsWhenFinalized()
    atexit.register(lambda: pathlib.Path(sys.argv[1]).write_text("exit handlers ran"))
    if sys.argv[2] == "sys.exit":
        sys.exit(3)
    exit_without_finalizing(3)
""")

HANGING_HANDLER = textwrap.dedent("""
    import atexit, time
    from dit_trainer.runs.process_exit import exit_without_finalizing

    def close_the_tracker():
        time.sleep(3600)

    atexit.register(close_the_tracker)
    exit_without_finalizing(0, grace_seconds=1.0)
""")


def run_python(source: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", source, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_exit_runs_the_exit_handlers_and_skips_a_finalization_that_hangs(tmp_path: Path):
    marker = tmp_path / "marker"
    with pytest.raises(subprocess.TimeoutExpired):  # the hang this guards against
        run_python(SCRIPT, str(marker), "sys.exit", timeout=5)
    marker.unlink()
    result = run_python(SCRIPT, str(marker), "exit_without_finalizing", timeout=30)
    assert result.returncode == 3, result.stderr
    assert marker.read_text() == "exit handlers ran"


def test_an_exit_handler_that_hangs_is_ended_with_the_stacks_of_every_thread():
    result = run_python(HANGING_HANDLER, timeout=30)
    assert result.returncode == 1
    assert "Timeout" in result.stderr and "close_the_tracker" in result.stderr, result.stderr
