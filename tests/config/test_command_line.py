"""The command line is checked against the schema before Hydra composes it: a mistyped key or config option is one
paragraph naming it and the closest valid ones, exit 2, without importing torch."""

import pytest

from dit_trainer.config.command_line import check_command_line, closest_keys, schema_keys
from dit_trainer.errors import ConfigError

from ..conftest import CONFIG_DIR, run_script

KEYS = list(schema_keys())


@pytest.mark.parametrize(
    ("key", "meant"),
    [("trainer.lrr", "optim.lr"), ("trainer.sample_ste", "diffusion.sample_steps"),
     ("optim.warmup", "optim.warmup_steps"), ("trainer.max_step", "trainer.max_steps")],
)  # fmt: skip
def test_the_closest_keys_lead_with_the_one_meant(key, meant):
    assert closest_keys(key, KEYS)[0] == meant


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["trainer.lrr=1"], "`trainer.lrr`"),
     (["+experiment=shapes", "data.resolutoin=64"], "`data.resolution`"),
     (["model=pixart_tin"], "`model=pixart_tiny`"),
     (["+experiment=shpes"], "`+experiment=shapes`")],
)  # fmt: skip
def test_a_mistyped_key_or_option_is_refused_naming_the_closest(argv, named):
    with pytest.raises(ConfigError) as caught:
        check_command_line(argv, CONFIG_DIR)
    assert named in str(caught.value)


@pytest.mark.parametrize(
    "argv",
    [["+experiment=shapes", "trainer.max_steps=5", "model=pixart_xl_2", "hydra.run.dir=/tmp/x", "--cfg", "job"],
     ["reward=none", r"+reward.weights={toy_extension\:TOY_REWARD:1.0}", "data.buckets=[[32,32]]", "~model"],
     ["-m", "optim.lr=1e-3,1e-4", "monitor.grpo.prompts=[a,b]", "reward.weights.clip_score=1.0"]],
)  # fmt: skip
def test_valid_command_lines_pass(argv):
    check_command_line(argv, CONFIG_DIR)


def test_train_py_answers_a_mistyped_key_with_exit_2_and_no_torch():
    code = (
        "import runpy, sys\nsys.argv = ['train.py', 'trainer.lrr=1']\n"
        "try:\n    runpy.run_path('train.py', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    print(exit.code, 'torch' in sys.modules, 'diffusers' in sys.modules)\n"
    )
    result = run_script(["-c", code], timeout=60)
    assert result.stdout.split() == ["2", "False", "False"], result.stdout + result.stderr
    assert "`trainer.lrr` is 1, but the config has no such key (the closest are `optim.lr`" in result.stderr
