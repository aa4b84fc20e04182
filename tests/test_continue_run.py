"""``trainer.resume=RUN`` on train.py's command line (``run_config.continue_run``): the run's recorded config becomes
the base Hydra composes onto, so only the overrides given now change it (the defaults do not come back); the run
folder becomes ``hydra.run.dir`` (from the command line, so every process of a launch agrees), or, with another
``hydra.run.dir`` or under ``-m``, the run's checkpoint is where a new run starts; ``latest`` and a checkpoint outside
a run folder work as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dit_trainer.config import TrainConfig, register_configs
from dit_trainer.errors import ConfigError
from dit_trainer.run_config import continue_run

from .conftest import CONFIG_DIR


@pytest.fixture
def recorded_run(tmp_path) -> Path:
    """A run folder as train.py leaves it, for the command line's sake: a resolved config.yaml (batch size 8, a
    permission to change the config given at its last launch) and a complete checkpoint-4."""
    run_dir = tmp_path / "run"
    checkpoint = run_dir / "checkpoints" / "checkpoint-4"
    (checkpoint / "transformer").mkdir(parents=True)
    (checkpoint / "manifest.json").write_text(json.dumps({"files": {}}))
    config = OmegaConf.structured(TrainConfig)
    config.vae.pretrained, config.conditioner.pretrained = "/models/vae", "/models/text"  # resolved, as saved
    config.trainer.batch_size, config.trainer.allow_config_change, config.optim.lr = 8, True, 3e-4
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(config))
    yield run_dir
    register_configs()  # the schema back in the ConfigStore


def composed(argv: list[str]):
    """What Hydra composes from ``argv`` (its ``hydra.*`` items are Hydra's own settings)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=[item for item in argv if not item.startswith(("hydra", "-"))])


def test_a_run_folder_continues_there_with_its_recorded_config_and_only_the_new_overrides(recorded_run):
    continuation = continue_run([f"trainer.resume={recorded_run}", "optim.lr=1e-3", "logger=tensorboard"])
    assert continuation.in_place and continuation.checkpoint is None
    assert f"hydra.run.dir='{recorded_run}'" in continuation.argv and "hydra.output_subdir=null" in continuation.argv
    cfg = composed(continuation.argv)
    assert cfg.trainer.resume == "latest" and cfg.trainer.batch_size == 8  # recorded, not the default 32
    assert (cfg.optim.lr, cfg.logger.name) == (1e-3, "tensorboard")  # the overrides given now, a group's included
    assert cfg.trainer.allow_config_change is False  # given for one launch, not recorded for the next
    assert cfg.vae.pretrained == "/models/vae"


def test_a_checkpoint_in_a_run_folder_continues_that_run_from_it(recorded_run):
    checkpoint = recorded_run / "checkpoints" / "checkpoint-4"
    continuation = continue_run([f"trainer.resume={checkpoint}", f"hydra.run.dir={recorded_run}/"])
    assert continuation.in_place and continuation.checkpoint == checkpoint
    assert [item for item in continuation.argv if item.startswith("hydra.run.dir")] == [
        f"hydra.run.dir='{recorded_run}'"
    ]
    assert composed(continuation.argv).trainer.resume == str(checkpoint)


def test_another_run_folder_starts_from_the_runs_newest_checkpoint(recorded_run, tmp_path):
    continuation = continue_run([f"trainer.resume={recorded_run}", f"hydra.run.dir={tmp_path / 'fork'}"])
    assert not continuation.in_place and f"hydra.run.dir={tmp_path / 'fork'}" in continuation.argv
    cfg = composed(continuation.argv)
    assert cfg.trainer.resume == str(recorded_run / "checkpoints" / "checkpoint-4") and cfg.trainer.batch_size == 8
    (recorded_run / "checkpoints" / "checkpoint-4" / "manifest.json").unlink()  # no complete checkpoint left
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        continue_run([f"trainer.resume={recorded_run}", f"hydra.run.dir={tmp_path / 'fork'}"])


def test_the_command_line_that_started_the_run_continues_it(recorded_run):
    """A key the first launch added (``+model.extra_config.ffn_dim=32``) is in the record; given again it is set,
    and a key added now for the first time is added."""
    config = OmegaConf.load(recorded_run / "config.yaml")
    config.model.extra_config = {"ffn_dim": 32}
    (recorded_run / "config.yaml").write_text(OmegaConf.to_yaml(config))
    argv = [f"trainer.resume={recorded_run}", "+model.extra_config.ffn_dim=48", "+model.extra_config.qk_norm=rms"]
    cfg = composed(continue_run(argv).argv)
    assert OmegaConf.to_container(cfg.model.extra_config) == {"ffn_dim": 48, "qk_norm": "rms"}


def test_hydras_flags_typed_after_the_overrides_stay_after_them(recorded_run):
    """argparse takes Hydra's overrides in one run: the resume's own, added after `--cfg job`, were refused as
    unrecognized arguments."""
    from hydra._internal.utils import get_args_parser

    argv = continue_run([f"trainer.resume={recorded_run}", "trainer.max_steps=9", "--cfg", "job"]).argv
    parsed = get_args_parser().parse_args(argv)
    assert parsed.cfg == "job" and parsed.overrides[0] == "trainer.max_steps=9"
    assert "trainer.resume=latest" in parsed.overrides and "hydra.output_subdir=null" in parsed.overrides


def test_a_path_hydra_would_split_is_passed_on_quoted(recorded_run):
    odd = recorded_run.rename(recorded_run.with_name("my run, take 2"))
    continuation = continue_run([f"trainer.resume='{odd}'"])
    assert continuation.run_dir == odd and composed(continuation.argv).trainer.batch_size == 8


@pytest.mark.parametrize("value", ["latest", "null", "{tmp}", "{tmp}/run/checkpoints"])
def test_anything_else_is_trainer_resume_as_before(recorded_run, tmp_path, value):
    assert continue_run([f"trainer.resume={value.format(tmp=tmp_path)}"]) is None
    assert continue_run(["-sc", "install=bash"]) is None and continue_run(["optim.lr=1e-3"]) is None


def test_a_recorded_key_this_version_does_not_have_is_one_paragraph(recorded_run):
    text = (recorded_run / "config.yaml").read_text().replace("trainer:\n", "trainer:\n  max_stepz: 3\n")
    (recorded_run / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match="max_stepz") as caught:
        continue_run([f"trainer.resume={recorded_run}"])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("broken", ["trainer: [batch_size: 8\n", "- a list\n- not a mapping\n"])
def test_a_recorded_config_that_is_not_yaml_is_one_paragraph(recorded_run, broken):
    (recorded_run / "config.yaml").write_text(broken)
    with pytest.raises(ConfigError, match="config.yaml") as caught:
        continue_run([f"trainer.resume={recorded_run}"])
    assert "\n" not in str(caught.value)
