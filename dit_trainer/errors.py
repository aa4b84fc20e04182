"""Every error a user can see, and the exit code each one ends a command with.

Each error is one paragraph that names what is wrong and how to fix it; ``train.py``, the scripts and the run-folder
check print it and exit with ``exit_code(error)``. This module imports nothing, so any part of the package can raise
these without pulling in the config schema, Hydra or torch.

Exit codes: 0 done; 2 bad input (a config value, a missing model, an unwritable folder, a gradient-flow problem:
nothing trained); 3 preempted by SIGTERM/SIGUSR1 after writing a checkpoint (requeue with
``trainer.resume=latest``); 4 stopped after ``trainer.max_consecutive_nonfinite`` non-finite steps; 5 a checkpoint
could not be written (disk full, quota), earlier checkpoints are intact; 130 stopped by Ctrl-C (SIGINT, the shell's
code for it): after writing a checkpoint, or at once on a second Ctrl-C.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_PREEMPTED = 3
EXIT_NONFINITE = 4
EXIT_CHECKPOINT_FAILED = 5
EXIT_INTERRUPTED = 130  # 128 + SIGINT: what shells and job scripts read as "stopped by the user", not a requeue


def shortlist(items: list[str], limit: int, separator: str = ", ") -> str:
    """The first ``limit`` of ``items`` and a count of the rest, so that a message stays one readable paragraph."""
    rest = f"{separator}and {len(items) - limit} more" if len(items) > limit else ""
    return separator.join(items[:limit]) + rest


def _rebuilt(error_type: type[Exception], args: tuple, fields: dict[str, Any]) -> Exception:
    """An error unpickled as it was, without calling its ``__init__`` again (whose arguments are not its message)."""
    error = error_type.__new__(error_type, *args)
    error.__dict__.update(fields)
    return error


def _reduce(error: Exception) -> tuple:
    return _rebuilt, (type(error), error.args, error.__dict__)


def paragraph_from_worker(error_type: type[Exception], text: str) -> str:
    """The paragraph of an ``error_type`` a DataLoader worker raised, out of the one string torch rebuilds it from
    in the main process: ``ExceptionWrapper.reraise`` sends no exception object, only its type and the worker's
    formatted traceback, and calls ``error_type("Caught <name> in DataLoader worker process N.\nOriginal
    Traceback ...\n<module>.<name>: <paragraph>")``. Raises TypeError for any other single string."""
    name = f"{error_type.__module__}.{error_type.__qualname__}: "
    head, found, paragraph = text.rpartition(f"\n{name}")
    if not (found and text.startswith(f"Caught {error_type.__name__} ") and "\nOriginal Traceback" in head):
        raise TypeError(f"{error_type.__name__} takes its fields, not one message: {text[:200]!r}")
    return paragraph.strip()


_FROM_WORKER = object()  # ConfigError(text): torch re-raising a DataLoader worker's ConfigError


class ConfigError(ValueError):
    """A bad configuration value, explained in one paragraph: the key, the value, what is accepted, the fix.

    Raised in a DataLoader worker, it reaches the main process as the same paragraph (``paragraph_from_worker``):
    there only the key is known again, and ``value``, ``accepted`` and ``fix`` are None. It pickles with its fields.
    """

    def __init__(
        self, key: str, value: Any = _FROM_WORKER, accepted: str | None = None, fix: str | None = None
    ) -> None:
        if value is _FROM_WORKER:
            paragraph = paragraph_from_worker(ConfigError, key)
            super().__init__(paragraph)
            self.key = paragraph.partition("`")[2].partition("`")[0]
            self.value = self.accepted = self.fix = None
            return
        if accepted is None:
            raise TypeError("ConfigError(key, value, accepted, fix=None) needs what is accepted")
        fix = fix or f"override it on the command line, e.g. `{key}=<accepted value>`"
        super().__init__(f"Invalid config: `{key}` is {value!r}, but {accepted}. To fix it, {fix}.")
        self.key, self.value, self.accepted, self.fix = key, value, accepted, fix

    __reduce__ = _reduce

    def renamed(self, key: str) -> ConfigError:
        """The same paragraph about the setting ``key``: for an error raised by code that knows the value but not
        which setting gave it (a data set built from a mixture entry's path names `data.path`, which is unset)."""
        old, new = f"`{self.key}", f"`{key}"  # `data.path` and `data.path=...` alike
        return ConfigError(key, self.value, self.accepted.replace(old, new), self.fix.replace(old, new))


def require(ok: bool, key: str, value: Any, accepted: str, fix: str | None = None) -> None:
    """Raise ``ConfigError(key, value, accepted, fix)`` unless ``ok``: how every config check reads."""
    if not ok:
        raise ConfigError(key, value, accepted, fix)


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message names the id/path, the config key and the way out."""


class GradientFlowError(RuntimeError):
    """The preflight before the first step found that the loss cannot train the DiT (the message says why)."""


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with non-finite loss or gradients; the message reports what and suggests fixes."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, permissions); earlier checkpoints are untouched."""

    def __init__(self, step: int, folder: Path, cause: Exception, complete: list[Path]) -> None:
        newest = f"the newest complete one, {complete[-1]}, is intact" if complete else "no earlier checkpoint exists"
        if isinstance(cause, OSError):
            reason = f"{cause.strerror or cause} ({cause.filename or folder})"
        else:  # torch.save and safetensors report a full disk in their own words
            reason = f"{type(cause).__name__}: {' '.join(str(cause).split())[:300]}"
        super().__init__(
            f"Could not write the checkpoint of step {step} to {folder}: {reason}. The partial folder is removed "
            f"(at the latest when the run resumes) and {newest}. To fix it, free space or point `hydra.run.dir` at a "
            "larger, writable disk, then continue with `trainer.resume=latest`."
        )

    __reduce__ = _reduce


EXIT_CODES: dict[type[Exception], int] = {
    ConfigError: EXIT_BAD_INPUT,
    ModelLoadError: EXIT_BAD_INPUT,
    GradientFlowError: EXIT_BAD_INPUT,
    NonFiniteError: EXIT_NONFINITE,
    CheckpointWriteError: EXIT_CHECKPOINT_FAILED,
}
USER_ERRORS = tuple(EXIT_CODES)


def exit_code(error: BaseException) -> int:
    """The exit code for one of ``USER_ERRORS``; any other exception is a bug, and asking for its code is too."""
    for error_type, code in EXIT_CODES.items():
        if isinstance(error, error_type):
            return code
    raise TypeError(f"{type(error).__name__} is not an error users can act on; let its traceback through") from error
