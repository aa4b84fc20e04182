"""The scripts' command lines (``cli.py``): a bare run folder and key=value overrides, a bad or missing argument or
value is one paragraph and exit 2, and sampling and precompute never import the training package."""

import pytest

from dit_trainer.apps.cli import parse_cli, run_cli, run_train_script
from dit_trainer.config import SampleConfig
from dit_trainer.errors import EXIT_BAD_INPUT
from tests.conftest import CONFIG_DIR, run_here, run_script


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
    from dit_trainer.apps.inference import sample_to_folder

    assert run_cli(sample_to_folder, SampleConfig, argv, "usage: sample.py ...") == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert named in err and "usage: sample.py" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "paragraph"),
    [(["runs/a", "out_dir=o", "steps=abc"],
      "`steps` is 'abc', but it must be a whole number or null. To fix it, set e.g. `steps=1`."),
     (["runs/a", "out_dir=o", "guidance_scale=abc"],  # a scale the field takes, not 0.5 (any number's example)
      "`guidance_scale` is 'abc', but it must be a number or null. To fix it, set e.g. `guidance_scale=3.0`, or leave "
      "it out for the run's own."),
     (["runs/a", "outdir=o"], "`outdir` is 'o', but it is not an argument of this command (the closest: `out_dir`"),
     (["runs/a", "out_dir=o", "batch_size=0"], "`batch_size` is 0, but it must be >= 1. To fix it, set e.g."),
     (["runs/a", "out_dir=o", "height=0"],  # not `height=1`, which the run's pixel grid then refused
      "`height` is 0, but it must be >= 1. To fix it, set a side the run trained at (its `data.resolution`"),
     (["runs/a", "out_dir=o", "prompts=[a red circle, a blue square"],
      "`prompts` is '[a red circle, a blue square', but it cannot be read as this argument's value"),
     (["runs/a", "out_dir=@o"], "`out_dir` is '@o', but it cannot be read as this argument's value")],
)  # fmt: skip
def test_a_mistyped_key_or_value_is_named_in_one_paragraph_not_omegaconf_s_block(argv, paragraph, capsys):
    from dit_trainer.apps.inference import sample_to_folder

    assert run_cli(sample_to_folder, SampleConfig, argv, "usage: sample.py ...") == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    (error,) = [line for line in err.splitlines() if line.startswith("error: ")]  # one line (an import may warn)
    assert error.startswith(f"error: Invalid config: {paragraph}") and "full_key" not in err and "Traceback" not in err


def test_ctrl_c_is_one_line_and_exit_130_as_in_train_py(capsys):
    """The scripts printed KeyboardInterrupt's traceback."""
    from dit_trainer.errors import EXIT_INTERRUPTED

    def interrupted(args):
        raise KeyboardInterrupt

    assert run_cli(interrupted, SampleConfig, ["runs/a", "out_dir=o"], "usage: sample.py ...") == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "Stopped by Ctrl-C.\n"


def test_help_prints_the_usage_and_exits_0(capsys):
    from dit_trainer.apps.inference import sample_to_folder

    assert run_cli(sample_to_folder, SampleConfig, ["--help"], "usage: sample.py ...") == 0
    assert capsys.readouterr().out.strip() == "usage: sample.py ..."


@pytest.mark.parametrize(
    ("argv", "missing", "fix"),
    [([], "run_dir", "add `run_dir=...` to the command, or give it as the first argument (see the usage)"),
     (["runs/a"], "out_dir", "add `out_dir=...` to the command (see the usage)")],
)  # fmt: skip
def test_an_argument_without_a_default_left_off_is_named_in_one_paragraph(argv, missing, fix, capsys):
    from dit_trainer.apps.inference import sample_to_folder

    assert run_cli(sample_to_folder, SampleConfig, argv, "usage: sample.py ...") == EXIT_BAD_INPUT
    error, usage = capsys.readouterr().err.split("\n\n")
    assert error == f"error: Invalid config: `{missing}` is not given, but it has no default. To fix it, {fix}."
    assert usage.strip() == "usage: sample.py ..."


USAGE = "usage: script.py [train.py's overrides]"


def unreachable(cfg):
    raise AssertionError("the script ran")


def test_verify_gradients_reports_a_bad_value_without_a_traceback(capsys):
    """What scripts/verify_gradients.py runs, in-process: a bad value is one paragraph and exit code 2."""
    code = run_train_script(CONFIG_DIR, ["+experiment=shapes", "optim.lr=-1"], unreachable, USAGE)
    err = capsys.readouterr().err
    assert code == 2 and "`optim.lr`" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("override", "said"),
    [("model.num_layers=abc", "`model.num_layers` is 'abc', but it must be a whole number"),
     ("model.num_layer=4", "`model.num_layer` is 4, but the config has no such key (the closest are `model.num_l")],
)  # fmt: skip
def test_the_scripts_that_take_train_py_s_overrides_check_them_as_train_py_does(override, said, capsys):
    """Hydra's compose API alone says only "Error merging override model.num_layers=abc"."""
    code = run_train_script(CONFIG_DIR, ["+experiment=shapes", override], unreachable, USAGE)
    assert code == 2 and said in capsys.readouterr().err


def test_the_scripts_that_take_train_py_s_overrides_answer_help_and_refuse_other_flags(capsys):
    """precompute.py --help was Hydra's lexer error (exit 2), and benchmark.py's mistyped --stepz too."""
    assert run_train_script(CONFIG_DIR, ["+experiment=shapes", "--help"], unreachable, USAGE) == 0
    assert capsys.readouterr().out == f"{USAGE}\n"
    assert run_train_script(CONFIG_DIR, ["+experiment=shapes", "--stepz", "2"], unreachable, USAGE) == 2
    assert capsys.readouterr().err == "error: unknown option --stepz (the options and overrides it takes: --help)\n"


@pytest.mark.slow
def test_train_py_refuses_an_extra_config_value_of_another_type_with_exit_2(tmp_path):
    """SD3's `+model.extra_config.dual_attention_layers=3` ended in `TypeError: 'int' object is not iterable`."""
    run = f"hydra.run.dir={tmp_path / 'run'}"
    result = run_here(["train.py", "+experiment=shapes_sd3", "model.num_layers=2", "trainer.max_steps=1",
                       "+model.extra_config.dual_attention_layers=3", run])  # fmt: skip
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last.startswith("error: Invalid config: `model.extra_config.dual_attention_layers` is 3") and "list" in last
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_sampling_and_precompute_do_not_import_training():
    """Loading a run back (sample, evaluate, export) and writing a cache need no part of the training package."""
    modules = [
        "dit_trainer.apps.inference",
        "dit_trainer.apps.evaluation",
        "dit_trainer.apps.export",
        "dit_trainer.apps.precompute",
    ]
    code = "import importlib, sys\n" + "".join(
        f"importlib.import_module({m!r}); assert 'dit_trainer.training' not in sys.modules, {m!r}\n" for m in modules
    )
    result = run_script(["-c", code], timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
