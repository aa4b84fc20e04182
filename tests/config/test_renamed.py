"""Keys that moved (``config/renamed.py``): ``monitor.grpo``, the reward monitor's earlier name, as command lines,
recipes and run folders of before the rename spell it: what it sets is moved to ``monitor.reward`` with a warning,
field by field over the recipe's, and only the new key is recorded."""

import dataclasses

from dit_trainer.config import TrainConfig
from dit_trainer.config.monitors import RenamedRewardMonitor
from dit_trainer.config.renamed import move_renamed_keys_in_saved
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
