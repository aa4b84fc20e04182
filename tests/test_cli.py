"""The error policy (``dit_trainer.errors``) and the scripts' command lines (``dit_trainer.cli``): every user error
is one paragraph with its exit code, a bug is not swallowed, and sampling never imports the training package."""

import pytest

from dit_trainer.cli import parse_cli, run_cli
from dit_trainer.config import SampleConfig
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


def test_parse_cli_takes_a_bare_run_folder_and_key_value_overrides():
    cfg = parse_cli(SampleConfig, ["runs/a", "out_dir=samples", "images_per_prompt=2"])
    assert (cfg.run_dir, cfg.out_dir, cfg.images_per_prompt, cfg.checkpoint) == ("runs/a", "samples", 2, "latest")


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["runs/a", "out_dir=o", "images_per_prompt=0"], "`images_per_prompt`"),
     (["runs/a", "out_dir=o", "sampler=heun"], "ddim, dpmsolver++, euler"),
     (["runs/a", "out_dir=o", "nosuchkey=1"], "nosuchkey")],
)  # fmt: skip
def test_a_bad_script_argument_is_one_paragraph_and_exit_2(argv, named, capsys):
    from dit_trainer.inference import sample_to_folder

    assert run_cli(sample_to_folder, SampleConfig, argv, "usage: sample.py ...") == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert named in err and "usage: sample.py" in err and "Traceback" not in err


@pytest.mark.slow
def test_sampling_and_precompute_do_not_import_training():
    """Loading a run back (sample, evaluate, export) and writing a cache need no part of the training package."""
    modules = ["dit_trainer.inference", "dit_trainer.evaluation", "dit_trainer.export", "dit_trainer.data.precompute"]
    code = "import importlib, sys\n" + "".join(
        f"importlib.import_module({m!r}); assert 'dit_trainer.training' not in sys.modules, {m!r}\n" for m in modules
    )
    result = run_script(["-c", code], timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_errors_module_imports_nothing_of_the_package():
    result = run_script(["-c", "import sys, dit_trainer.errors; print(sorted(m for m in sys.modules if "
                         "m.startswith(('dit_trainer.', 'torch', 'hydra', 'omegaconf'))))"], timeout=60)  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "['dit_trainer.errors']", result.stdout + result.stderr
