"""What a resume refuses (``training/config_changes.py``): a change that redefines what is trained, as opposed to how
fast, how long or what is watched."""

import pytest

from dit_trainer.training.config_changes import config_changes, defines_training


@pytest.mark.parametrize(
    ("key", "saved", "current", "grpo", "defining"),
    [("validation.every_n_steps", 0, 500, False, True),  # turned on: trained-on images become validation images
     ("validation.every_n_steps", 500, 1000, False, False),  # validated more often: the same images held out
     ("validation.split", 0.01, 0.02, False, True),
     ("validation.seed", 0, 1, False, True),
     ("validation.path", None, "/data/val", False, True),
     ("validation.timesteps", 8, 16, False, False),
     ("grpo.prompts", ["a", "b"], ["a", "c"], True, True),
     ("grpo.group_size", 16, 8, True, True),
     ("grpo.beta", 0.0, 0.04, True, True),
     ("grpo.noise_level", None, 0.5, True, True),
     ("grpo.sde_steps", None, 4, True, True),
     ("reward.weights.shapes_alignment", 1.0, None, True, True),  # what GRPO trains on
     ("reward.weights.shapes_alignment", 1.0, None, False, False),  # what a monitor watches
     ("grpo.prompts", [], ["a"], False, False),  # GRPO off: its settings are inert
     ("data.length", 256, 300, False, True),
     ("optim.lr", 1e-3, 1e-4, False, False),
     ("diffusion.sample_steps", 25, 50, False, False)],
)  # fmt: skip
def test_which_changes_redefine_training(key, saved, current, grpo, defining):
    assert defines_training(key, saved, current, grpo) is defining


def test_config_changes_list_what_differs_but_what_resuming_changes():
    saved = {"trainer": {"max_steps": 10, "resume": None}, "validation": {"every_n_steps": 0, "split": 0.1}}
    current = {"trainer": {"max_steps": 20, "resume": "latest"}, "validation": {"every_n_steps": 50, "split": 0.1}}
    assert config_changes(saved, current) == {"validation.every_n_steps": (0, 50)}
