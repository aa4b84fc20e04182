"""Rewards from the ``reward`` config and its checks (``rewards/build.py``): bad weights name the key, and a CLIP model
missing from this machine is named only when the monitor uses it."""

import pytest
import torch

from dit_trainer.config import RewardConfig
from dit_trainer.errors import ConfigError, ModelLoadError
from dit_trainer.rewards.build import build_reward

from ..conftest import compose_config, one_paragraph

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("weights", "key"),
    [
        ({"aesthetic": 1.0}, "reward.weights.aesthetic"),
        ({}, "reward.weights"),
        ({"clip_score": float("nan")}, "reward.weights.clip_score"),
        ({"shapes_alignment": 0.0, "jpeg_compressibility": 0.0}, "reward.weights"),  # scores nothing
    ],
)
def test_bad_reward_configs_name_the_key(weights, key):
    with pytest.raises(ConfigError) as caught:
        build_reward(RewardConfig(weights=weights), CPU)
    assert f"`{key}`" in str(caught.value)


def test_offline_validation_names_a_missing_clip_model_only_when_the_monitor_uses_it():
    with pytest.raises(ModelLoadError, match="reward.clip_model=openai/clip-vit-base-patch32"):
        compose_config(["+experiment=shapes", "reward=clip_score"])
    assert compose_config(["+experiment=shapes", "reward=clip_score", "monitor.reward.enabled=false"])


def test_a_reward_that_does_not_score_what_the_run_samples_is_refused_with_the_config():
    """A clip run's reward monitor with an image reward failed at its first scoring (a ValueError after the steps
    before it, no checkpoint); an image run's with the clips' judge alike."""
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=moving_shapes", "reward=jpeg_compressibility"])
    message = one_paragraph(caught.value, "reward.weights.jpeg_compressibility")
    assert "scores images, and this run samples clips (`data.frames=4`)" in message
    assert "`moving_shapes_alignment`" in message
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", "reward=moving_shapes_alignment"])
    assert "scores clips, and this run samples images" in one_paragraph(
        caught.value, "reward.weights.moving_shapes_alignment"
    )
    assert compose_config(["+experiment=moving_shapes", "reward=jpeg_compressibility", "monitor.reward.enabled=false"])
