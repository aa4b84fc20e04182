"""How a process of a multi-process launch ends once its run is over: within a bounded time, whatever the teardown.

Everything a run owes its user (checkpoints, metrics, summary, the tracker's last upload) is written before ``run``
returns. What remains is the interpreter's finalization, where gloo's worker threads and autograd's can race the
teardown of the interpreter and hang the process forever (pytorch/pytorch#190489, #75097). The launcher then never
returns and a finished job holds its allocation until the scheduler's time limit. So such a process runs its exit
handlers (``atexit``: loggers, trackers, multiprocessing's children) and then leaves without finalizing; a watchdog
in C (``faulthandler``, which needs no interpreter) ends it, with every thread's stack on stderr, if even that hangs.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import sys
from typing import NoReturn

TEARDOWN_GRACE_SECONDS = 120.0


def exit_without_finalizing(code: object = 0, grace_seconds: float = TEARDOWN_GRACE_SECONDS) -> NoReturn:
    """Run the exit handlers, flush the standard streams and exit with ``code`` (read as ``sys.exit`` reads it: None
    is 0, an int itself, anything else is printed and exits 1), skipping the finalization that can hang. A handler
    that hangs past ``grace_seconds`` gets every thread's stack printed and exit code 1."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    faulthandler.dump_traceback_later(grace_seconds, exit=True)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code or 0)
