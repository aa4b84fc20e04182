"""Keys that moved (``config/renamed.py``), as command lines, recipes and run folders of before the rename spell them:
``monitor.grpo`` (now ``monitor.reward``) and the ``text_encoder`` section and group (now ``conditioner``). What they
set is moved with a warning, field by field over the recipe's, and only the new key is recorded."""

import dataclasses

from dit_trainer.config import TrainConfig
from dit_trainer.config.conditioner import RenamedTextEncoder
from dit_trainer.config.monitors import RenamedRewardMonitor
from dit_trainer.config.renamed import move_renamed_keys, move_renamed_keys_in_saved
from dit_trainer.training.state.config_changes import config_changes

from ..conftest import compose_config

SHAPES = ["+experiment=shapes"]  # its recipe turns the reward monitor on, every 500 steps, on its captions


def test_the_reward_monitors_earlier_keys_are_moved_field_by_field_with_a_warning(caplog):
    recipe = compose_config(SHAPES).monitor.reward
    with caplog.at_level("WARNING", logger="dit_trainer.config.renamed"):
        cfg = compose_config([*SHAPES, "monitor.grpo.every_n_steps=7", "monitor.grpo.group_size=3"])
    assert "`monitor.grpo.every_n_steps` -> `monitor.reward.every_n_steps`" in caplog.text
    assert (cfg.monitor.reward.every_n_steps, cfg.monitor.reward.group_size) == (7, 3)
    assert cfg.monitor.reward.enabled and cfg.monitor.reward.prompt_file == recipe.prompt_file  # the recipe's rest
    assert cfg.monitor.grpo == RenamedRewardMonitor()  # recorded only at the new key
    assert not compose_config([*SHAPES, "monitor.grpo.enabled=false"]).monitor.reward.enabled  # a default value too


def test_a_checkpoint_written_before_the_monitor_rename_compares_as_written_now():
    now = dataclasses.asdict(TrainConfig())
    before = {**now, "monitor": {"grpo": now["monitor"]["reward"], "fid": now["monitor"]["fid"]}}
    assert config_changes(move_renamed_keys_in_saved(before), now) == {}
    assert move_renamed_keys_in_saved(now) is now


def test_the_earlier_text_encoder_keys_are_moved_to_the_conditioner_with_a_warning(caplog):
    recipe = compose_config(SHAPES).conditioner
    with caplog.at_level("WARNING", logger="dit_trainer.config.renamed"):
        cfg = compose_config([*SHAPES, "text_encoder.max_length=5"])
    assert "`text_encoder.max_length` -> `conditioner.max_length`" in caplog.text
    assert cfg.conditioner == dataclasses.replace(recipe, max_length=5)  # the recipe's rest (memo_size=1024) kept
    assert cfg.text_encoder == RenamedTextEncoder()


def test_an_option_of_the_earlier_text_encoder_group_selects_the_conditioners(caplog):
    """`text_encoder=t5` over a recipe that picks MiniLM gives what `conditioner=t5` gives (a key set on the old
    name after it still wins, as it did), and the warning names the new group."""
    with caplog.at_level("WARNING", logger="dit_trainer.config.renamed"):
        old = TrainConfig(text_encoder=RenamedTextEncoder(kind="t5", max_length=7, group="t5"))
        moved = move_renamed_keys(old)
    assert "`text_encoder=t5` -> `conditioner=t5`" in caplog.text
    assert (moved.conditioner.kind, moved.conditioner.max_length) == ("t5", 7)
    composed = compose_config(["text_encoder=minilm", "text_encoder.max_length=6"])
    assert composed.conditioner == dataclasses.replace(compose_config(["conditioner=minilm"]).conditioner, max_length=6)
    assert composed.text_encoder == RenamedTextEncoder()


def test_a_checkpoint_written_before_the_conditioner_rename_compares_as_written_now():
    now = dataclasses.asdict(TrainConfig())
    before = {key: value for key, value in now.items() if key not in ("conditioner", "text_encoder")}
    before["text_encoder"] = now["conditioner"]
    assert config_changes(move_renamed_keys_in_saved(before), now) == {}
    changed = {**before, "text_encoder": {**now["conditioner"], "max_length": 3}}
    assert config_changes(move_renamed_keys_in_saved(changed), now) == {"conditioner.max_length": (3, 120)}


def test_an_option_of_the_earlier_group_replaces_the_conditioner_a_recipe_chose(online, tmp_path, caplog):
    """`+experiment=dit text_encoder=minilm` gives MiniLM as `conditioner=minilm` does, not MiniLM's two keys over
    the recipe's T5 (a group option replaces its section); the warning names what was dropped."""
    (tmp_path / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    recipe = ["+experiment=dit", f"data.path={tmp_path}"]
    with caplog.at_level("WARNING", logger="dit_trainer.config.renamed"):
        old = compose_config([*recipe, "text_encoder=minilm"])
    assert old.conditioner == compose_config([*recipe, "conditioner=minilm"]).conditioner
    assert "dropping `conditioner.pretrained='PixArt-alpha/PixArt-XL-2-1024-MS'`" in caplog.text


def test_a_run_folder_written_before_the_rename_takes_the_new_keys_of_a_command_line(tmp_path):
    """Its `text_encoder` section becomes `conditioner` before the command line's keys meet it, so that
    `conditioner.KEY` given to a resume wins over the folder's, as over a folder written after the rename."""
    from omegaconf import OmegaConf

    from dit_trainer.run_config import saved_config, to_train_config

    now = dataclasses.asdict(compose_config(SHAPES))
    before = {key: value for key, value in now.items() if key not in ("conditioner", "text_encoder")}
    before["text_encoder"] = now["conditioner"]
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(before)))
    saved = saved_config(tmp_path)
    assert saved.conditioner.max_length == now["conditioner"]["max_length"] == 8
    resumed = to_train_config(OmegaConf.merge(saved, OmegaConf.from_dotlist(["conditioner.max_length=5"])))
    assert resumed.conditioner.max_length == 5 and resumed.text_encoder == RenamedTextEncoder()
