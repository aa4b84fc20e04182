"""The error policy (``errors.py``): every user error is one paragraph with its exit code, a bug is not swallowed, and
the module imports nothing of the package."""

import pytest

from dit_trainer.errors import (
    EXIT_BAD_INPUT,
    EXIT_CHECKPOINT_FAILED,
    EXIT_NONFINITE,
    CheckpointWriteError,
    ConfigError,
    GradientFlowError,
    ModelLoadError,
    NonFiniteError,
    exit_code,
)

from .conftest import run_script


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("trainer.batch_size", 0, "it must be >= 1"), EXIT_BAD_INPUT),
        (ModelLoadError("no such model"), EXIT_BAD_INPUT),
        (GradientFlowError("detached"), EXIT_BAD_INPUT),
        (NonFiniteError("nan"), EXIT_NONFINITE),
        (CheckpointWriteError(3, "/runs/x/.checkpoint-3.partial", OSError(28, "Full"), []), EXIT_CHECKPOINT_FAILED),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_every_user_error_has_its_exit_code(error, code):
    assert exit_code(error) == code


def test_a_bug_has_no_exit_code():
    with pytest.raises(TypeError, match="KeyError"):
        exit_code(KeyError("a bug"))


def test_a_config_error_is_one_paragraph_with_key_value_and_fix():
    message = str(ConfigError("optim.lr", -1.0, "it must be > 0", "set e.g. `optim.lr=1e-4`"))
    assert message == "Invalid config: `optim.lr` is -1.0, but it must be > 0. To fix it, set e.g. `optim.lr=1e-4`."


def test_the_errors_module_imports_nothing_of_the_package():
    result = run_script(["-c", "import sys, dit_trainer.errors; print(sorted(m for m in sys.modules if "
                         "m.startswith(('dit_trainer.', 'torch', 'hydra', 'omegaconf'))))"], timeout=60)  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "['dit_trainer.errors']", result.stdout + result.stderr
