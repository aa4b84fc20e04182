"""The gold-reward watch's judgement (keep the best, stop on a gamed reward), its resume state, its refusals, and
``checkpoint=best_gold`` finding what a run kept."""

import json

import pytest

from dit_trainer.errors import ConfigError
from dit_trainer.online.gold import BEST_GOLD, GoldJudge
from dit_trainer.runs.run_folder import find_checkpoint, write_kept
from dit_trainer.training.monitors.monitors import MonitorVerdict

from ..conftest import TINY_SHAPES, compose_config


def test_each_new_best_is_kept_and_a_fall_below_the_margin_stops_only_while_the_training_reward_rises():
    judge = GoldJudge("shapes_alignment", stop_margin=0.05, margin_key="grpo.gold_stop_margin")
    assert judge.judge(10, gold=0.80, training=1.0).keep == BEST_GOLD
    assert judge.judge(20, gold=0.90, training=1.1).keep == BEST_GOLD
    assert judge.judge(30, gold=0.86, training=1.3) == MonitorVerdict()  # below the best, within the margin
    assert judge.judge(40, gold=0.80, training=1.05).stop is None  # fell, but so did the training reward: no hacking
    verdict = judge.judge(50, gold=0.80, training=1.2)
    assert verdict.keep is None and "fell to 0.8000, 0.1000 below its best 0.9000 at step 20" in verdict.stop
    assert "`grpo.gold_stop_margin=0.05`" in verdict.stop and "checkpoint-20" in verdict.stop
    assert GoldJudge("g", stop_margin=None, margin_key="k").judge(1, 0.5, 0.0).keep == BEST_GOLD


def test_the_judge_resumes_with_its_best():
    judge = GoldJudge("g", stop_margin=0.1, margin_key="k")
    judge.judge(5, gold=0.7, training=2.0)
    resumed = GoldJudge("g", stop_margin=0.1, margin_key="k")
    resumed.load_state_dict(json.loads(json.dumps(judge.state_dict())))
    assert resumed.judge(10, gold=0.5, training=3.0).stop is not None
    assert resumed.best.step == 5


def test_checkpoint_best_gold_finds_the_kept_checkpoint_and_a_wrong_name_lists_the_kept_ones(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    for step in (3, 9):
        (checkpoints / f"checkpoint-{step}" / "transformer").mkdir(parents=True)
        (checkpoints / f"checkpoint-{step}" / "manifest.json").write_text('{"files": {}}')
    write_kept(checkpoints, {"best_gold": 3})
    assert find_checkpoint(tmp_path, "best_gold") == checkpoints / "checkpoint-3"
    assert find_checkpoint(tmp_path, "latest") == checkpoints / "checkpoint-9"
    with pytest.raises(ConfigError, match=r"`checkpoint` is 'best'.*`checkpoint=latest`, `checkpoint=best_gold`"):
        find_checkpoint(tmp_path, "best")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["grpo.gold_reward=shapes_alignment"], r"`grpo\.gold_reward` is 'shapes_alignment'.*also a training reward"),
        (["grpo.gold_stop_margin=0.05"], r"`grpo\.gold_stop_margin` is 0\.05.*`grpo\.gold_reward` is not set"),
        (["grpo.gold_reward=jpeg_compressibility", "grpo.gold_prompts=[a red circle]"],
         r"`grpo\.gold_prompts` is \['a red circle'\].*1 of its prompts are training prompts too"),
        (["grpo.gold_reward=jpeg_compressibility"], r"`grpo\.gold_prompts` is \[\].*no prompts were given"),
        (["grpo.gold_reward=sharpness"], r"`grpo\.gold_reward` is 'sharpness'.*accepted values are shapes_alignment"),
    ],
)  # fmt: skip
def test_what_the_watch_cannot_judge_is_refused_with_the_config(tmp_path, overrides, message):
    grpo = ["trainer.method=grpo", f"model.pretrained={tmp_path}", "grpo.prompts=[a red circle,a blue square]"]
    with pytest.raises(ConfigError, match=message):
        compose_config([*TINY_SHAPES, *grpo, "reward=shapes_alignment", *overrides])
