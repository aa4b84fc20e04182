"""Judging a trained run (``evaluation.py``): a reward must be given when the run configures none."""

import pytest


def test_evaluate_needs_a_reward_when_the_run_configures_none():
    from dit_trainer.config import EvaluateConfig, TrainConfig
    from dit_trainer.errors import ConfigError
    from dit_trainer.evaluation import evaluation_reward

    with pytest.raises(ConfigError, match="`weights`"):
        evaluation_reward(EvaluateConfig(run_dir="run"), TrainConfig())
