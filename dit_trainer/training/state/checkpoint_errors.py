"""How a checkpoint that does not load is told: which errors mean a file could not be read, and one line for each,
without the tracebacks torch.distributed.checkpoint prints of its own (a resume that falls back to the previous
checkpoint is a handled case, and the user sees one warning, not a traceback on every process)."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from collections.abc import Iterator

from safetensors import SafetensorError
from torch.distributed.checkpoint.api import CheckpointException

# What a damaged file raises when read. torch.distributed.checkpoint's CheckpointException (an FSDP checkpoint's
# sharded folders) is a BaseException: named here, as no `except Exception` sees it.
LOAD_ERRORS = (OSError, RuntimeError, ValueError, KeyError, EOFError, pickle.UnpicklingError, SafetensorError,
               CheckpointException)  # fmt: skip
DCP_SOURCES = os.path.join("torch", "distributed", "checkpoint", "")


def load_failure(error: BaseException) -> str:
    """One line saying why a checkpoint did not load. torch.distributed.checkpoint's exception carries each failed
    process's error and traceback: the first process's error stands for it."""
    failures = error.failures if isinstance(error, CheckpointException) else None
    if failures:
        rank, (inner, _) = next(iter(failures.items()))
        return f"{type(error).__name__} on process {rank}: {load_failure(inner)}"
    return f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"


class _DropDcpTracebacks(logging.Filter):
    """torch.distributed.checkpoint logs the errors it tries to recover from (an unreadable ``.metadata``) on the root
    logger, each with its traceback; the load's own failure says what went wrong."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and DCP_SOURCES in record.pathname)


@contextlib.contextmanager
def dcp_tracebacks_dropped() -> Iterator[None]:
    """While a checkpoint loads: torch.distributed.checkpoint's logged tracebacks are not printed."""
    root, dropped = logging.getLogger(), _DropDcpTracebacks()
    root.addFilter(dropped)
    try:
        yield
    finally:
        root.removeFilter(dropped)
