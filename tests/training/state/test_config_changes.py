"""What a resume refuses (``training/state/config_changes.py``): a change that redefines what is trained, as opposed to
how fast, how long or what is watched."""

import dataclasses

import pytest

from dit_trainer.config import TrainConfig
from dit_trainer.config.renamed import move_renamed_keys_in_saved
from dit_trainer.training.state.config_changes import config_changes, defines_training

GRPO = ("grpo", "reward")  # the sections GRPO trains by


@pytest.mark.parametrize(
    ("key", "saved", "current", "sections", "defining"),
    [("validation.every_n_steps", 0, 500, (), True),  # turned on: trained-on images become validation images
     ("validation.every_n_steps", 500, 1000, (), False),  # validated more often: the same images held out
     ("validation.split", 0.01, 0.02, (), True),
     ("validation.seed", 0, 1, (), True),
     ("validation.path", None, "/data/val", (), True),
     ("validation.timesteps", 8, 16, (), False),
     ("grpo.prompts", ["a", "b"], ["a", "c"], GRPO, True),
     ("grpo.group_size", 16, 8, GRPO, True),
     ("grpo.beta", 0.0, 0.04, GRPO, True),
     ("grpo.noise_level", None, 0.5, GRPO, True),
     ("grpo.sde_steps", None, 4, GRPO, True),
     ("reward.weights.shapes_alignment", 1.0, None, GRPO, True),  # what GRPO trains on
     ("reward.weights.shapes_alignment", 1.0, None, (), False),  # what a monitor watches
     ("grpo.prompts", [], ["a"], (), False),  # another method: GRPO's settings are inert
     ("trainer.method", "sft", "grpo", (), True),
     ("trainer.init_from", "runs/a", "runs/b", GRPO, True),
     ("trainer.seed", 0, 1, (), True),  # the data order: an epoch's rest would repeat and miss images
     ("trainer.batch_size", 32, 16, (), False),  # the data position is counted in images
     ("trainer.mixed_precision", "fp16", "bf16", (), False),
     ("data.length", 256, 300, (), True),
     ("optim.lr", 1e-3, 1e-4, (), False),
     ("diffusion.sample_steps", 25, 50, False, False)],
)  # fmt: skip
def test_which_changes_redefine_training(key, saved, current, sections, defining):
    assert defines_training(key, saved, current, sections) is defining


def test_a_checkpoint_written_before_the_method_seam_compares_as_written_now():
    """Its config has `grpo.enabled` and `grpo.init_*` where today's has `trainer.method` and `trainer.init_*`: a
    resume of it must see no change."""
    cfg = TrainConfig()
    now = dataclasses.asdict(cfg)
    now["trainer"] |= {"method": "grpo", "init_from": "runs/a", "init_ema": False, "init_weights": "runs/a/w"}
    before = {**now, "trainer": {k: v for k, v in now["trainer"].items() if not k.startswith(("method", "init_"))}}
    before["grpo"] = {**now["grpo"], "enabled": True, "init_from": "runs/a", "init_ema": False,
                      "init_weights": "runs/a/w"}  # fmt: skip
    assert config_changes(move_renamed_keys_in_saved(before), now) == {}
    assert move_renamed_keys_in_saved(now) is now


def test_config_changes_list_what_differs_but_what_resuming_changes():
    saved = {"trainer": {"max_steps": 10, "resume": None}, "validation": {"every_n_steps": 0, "split": 0.1}}
    current = {"trainer": {"max_steps": 20, "resume": "latest"}, "validation": {"every_n_steps": 50, "split": 0.1}}
    assert config_changes(saved, current) == {"validation.every_n_steps": (0, 50)}
