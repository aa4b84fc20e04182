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
