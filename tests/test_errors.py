"""The error policy (``errors.py``): every user error is one paragraph with its exit code, also when a DataLoader
worker raised it and once pickled, a bug is not swallowed, and the module imports nothing of the package."""

import pickle

import pytest
from torch.utils.data import DataLoader, IterableDataset

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


class _RefusingStream(IterableDataset):
    """A stream whose own check refuses the data in the DataLoader worker that reads it."""

    def __iter__(self):
        raise ConfigError("data.path", "/shards/{0..3}.tar", "the shards changed", "resume with the old ones")


def test_a_config_error_raised_in_a_data_loader_worker_reaches_the_main_process_as_its_paragraph():
    """torch re-raises a worker's error as ``type(text)`` with the worker's traceback in ``text``: a 4-field
    ConfigError became `RuntimeError: Caught ConfigError in DataLoader worker process 0`."""
    with pytest.raises(ConfigError) as raised:
        next(iter(DataLoader(_RefusingStream(), num_workers=1)))
    assert str(raised.value) == str(ConfigError("data.path", "/shards/{0..3}.tar", "the shards changed",
                                                "resume with the old ones"))  # fmt: skip
    assert raised.value.key == "data.path" and exit_code(raised.value) == EXIT_BAD_INPUT
    with pytest.raises(TypeError, match="takes its fields"):  # one string is only torch's re-raise
        ConfigError("data.path is wrong")


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("optim.lr", -1.0, "it must be > 0", "set e.g. `optim.lr=1e-4`"),
        CheckpointWriteError(3, "/runs/x/.checkpoint-3.partial", OSError(28, "Full"), []),
    ],  # fmt: skip
    ids=lambda error: type(error).__name__,
)
def test_user_errors_of_several_arguments_pickle_with_their_message_and_fields(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.__dict__ == error.__dict__
