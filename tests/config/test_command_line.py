"""The command line is checked against the schema before Hydra composes it: a mistyped key or config option is one
paragraph naming it and the closest valid ones, and a value whose braces lost their quotes in the shell one paragraph
naming the quoting that works, exit 2, without importing torch."""

import os
import shlex

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
     (["+experiment=shpes"], "`+experiment=shapes`"),
     (["+optim.weight_decayy=0.1"], "`optim.weight_decay`"),  # a `+` was dropped without a word, exit 0
     (["+trainer.foo=1"], "a `+` adds keys only below a field that takes any"),
     (["experiment=shapes"], "write `+experiment=shapes`"),  # Hydra's "No match in the defaults list", exit 1
     (["+experiment=shapes", "data.mixture=[{source: imagefolder, pth: /d}]"], "Key 'pth' not in 'MixtureSource'"),
     (["trainer={max_stepz: 3}"], "Key 'max_stepz' not in 'TrainerConfig'")],  # tracebacks, exit 1
)  # fmt: skip
def test_a_mistyped_key_or_option_is_refused_naming_the_closest(argv, named):
    with pytest.raises(ConfigError) as caught:
        check_command_line(argv, CONFIG_DIR)
    assert named in str(caught.value)


@pytest.mark.parametrize(
    "argv",
    [["+experiment=shapes", "trainer.max_steps=5", "model=pixart_xl_2", "hydra.run.dir=/tmp/x", "--cfg", "job"],
     ["reward=none", r"+reward.weights={toy_extension\:TOY_REWARD:1.0}", "data.buckets=[[32,32]]", "~model"],
     ["-m", "optim.lr=1e-3,1e-4", "monitor.reward.prompts=[a,b]", "reward.weights.clip_score=1.0"],
     ["+model.extra_config.sample_size=64", "+reward.weights.clip_score=1.0"]],
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


SHARDS = "/data/shards/{000000..000099}.tar"


@pytest.mark.parametrize(
    ("item", "works"),
    [(f"data.path={SHARDS}", f"\"data.path='{SHARDS}'\""),  # README's command after the shell took its quotes
     ("data.path={000000..000009}.tar", "\"data.path='{000000..000009}.tar'\""),
     ("data.path=${oc.env:HOME}/{0..9}.tar", "'data.path=\"${oc.env:HOME}/{0..9}.tar\"'"),  # no $ in double quotes
     ("data.path=/a/{0..9}.tar,/b/{0..3}.tar", "\"data.path='/a/{0..9}.tar','/b/{0..3}.tar'\""),  # a -m sweep
     ("data.mixture=[{source: webdataset, path: /d/{0..9}.tar, weight: 1}, {source: hf, path: x, weight: 1}]",
      "\"data.mixture=[{source: webdataset, path: '/d/{0..9}.tar', weight: 1}, {source: hf, path: x, weight: 1}]\"")],
)  # fmt: skip
def test_braces_hydra_would_refuse_are_answered_with_the_quoting_that_works(item, works):
    with pytest.raises(ConfigError) as caught:
        check_command_line(["+experiment=shapes", "data=webdataset", item], CONFIG_DIR)
    message = str(caught.value)
    assert "\n" not in message and "the shell removed the quotes" in message and message.endswith(f"`{works}`.")
    [typed] = shlex.split(works)  # what reaches the program when typed as shown
    assert "{" in typed and typed != item
    check_command_line([typed], CONFIG_DIR)  # Hydra parses it (else unquoted_braces would not have offered it)


@pytest.mark.parametrize(
    "item",
    [f"data.path='{SHARDS}'", f'data.path="{SHARDS}"', r"data.path=/d/\{0..9\}.tar", "+model.extra_config={a: 1}",
     "data.path=${oc.env:HOME}/x", "data.mixture=[{source: webdataset, path: '/d/{0..9}.tar', weight: 1}]",
     "+model.extra_config.dual_attention_layers=[0,1]", "data.path=/a/b}"],
)  # fmt: skip
def test_what_hydra_accepts_or_quoting_cannot_fix_is_not_refused(item):
    """Quotes that reached the program, escaped braces, dicts, interpolations; a stray brace is Hydra's to report."""
    check_command_line([item], CONFIG_DIR)


def test_a_shard_pattern_the_shell_expanded_is_refused_and_a_value_given_again_is_not():
    """Bash hands `data.path=/d/{000000..000003}.tar` over as four overrides; Hydra kept the last: one shard."""
    expanded = [f"data.path=/data/shards/{index:06d}.tar" for index in range(4)]
    with pytest.raises(ConfigError) as refused:
        check_command_line(["+experiment=dit", "data=webdataset", *expanded], CONFIG_DIR)
    message = str(refused.value)
    assert "given 4 times, with values that differ only in their numbers: the shell expanded" in message
    assert "`\"data.path='/data/shards/{000000..000099}.tar'\"`" in message
    check_command_line(["trainer.max_steps=2", "trainer.max_steps=8", "optim.lr=1e-3", "optim.lr=1e-4"], CONFIG_DIR)


def test_train_py_answers_unquoted_shard_braces_with_exit_2_and_no_traceback(tmp_path):
    """The README's webdataset command as bash hands it over: one paragraph, exit 2, no run folder."""
    run_dir = tmp_path / "run"
    result = run_script(["train.py", "+experiment=shapes", "data=webdataset", f"data.path={SHARDS}",
                         "trainer.max_steps=1", f"hydra.run.dir={run_dir}"], timeout=60)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"\"data.path='{SHARDS}'\"" in result.stderr.strip().splitlines()[-1] and not run_dir.exists()


@pytest.mark.parametrize("item", ["data.path=~/images", "trainer.resume=~"])
def test_a_value_starting_with_a_tilde_the_shell_left_is_answered_with_the_home_folder_written_out(item):
    """Typed in quotes, ``~`` reaches Hydra, whose grammar refuses it: one paragraph with what works instead."""
    with pytest.raises(ConfigError) as caught:
        check_command_line(["+experiment=shapes", item], CONFIG_DIR)
    key, _, value = item.partition("=")
    message = str(caught.value)
    assert "\n" not in message and "passed it on unexpanded" in message
    assert message.endswith(f"`{key}=$HOME{value[1:]}` (unquoted, or in double quotes).")
    check_command_line([f"{key}={os.path.expanduser(value)}"], CONFIG_DIR)  # what the shell makes of the fix
