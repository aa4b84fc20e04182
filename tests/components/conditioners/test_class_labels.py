"""Class labels as the condition (``components/conditioners/class_labels.py``): the classes of a class-conditional run
are read from the data's sub-folders, and what does not fit class conditioning is refused."""

import pytest

from dit_trainer.errors import ConfigError
from tests.conftest import TINY_SHAPES, class_conditional, compose_config

DIGIT_CLASSES = [str(digit) for digit in range(10)]


def test_classes_are_read_from_the_sub_folders_and_checked(digits):
    cfg = compose_config([*TINY_SHAPES, *class_conditional(digits)])
    assert cfg.conditioner.classes == DIGIT_CLASSES
    with pytest.raises(ConfigError, match=r"`conditioner\.kind`.*conditioned on class labels"):
        compose_config([*TINY_SHAPES, "model.family=dit"])
    with pytest.raises(ConfigError, match=r"`conditioner\.kind`.*conditioned on text"):
        compose_config([*TINY_SHAPES, *class_conditional(digits), "model.family=pixart_alpha"])
    with pytest.raises(ConfigError, match=r"`trainer\.sample_prompts`.*\['cat'\].*class names or ids"):
        compose_config([*TINY_SHAPES, *class_conditional(digits), "trainer.sample_prompts=[cat]"])
    missing = digits.parent / "no_such_folder"  # was refused as `conditioner.classes` is [], never naming the path
    with pytest.raises(ConfigError, match=r"`data\.path` is '.*no_such_folder', but there is no folder there"):
        compose_config([*TINY_SHAPES, *class_conditional(missing)])
    # Ghost clipping (the default mode) trains the DiT: its shared embedder runs once per forward under DP.
    compose_config([*TINY_SHAPES, *class_conditional(digits), "privacy.enabled=true", "privacy.noise_multiplier=1"])


def test_hidden_and_empty_sub_folders_are_no_classes(tmp_path):
    from PIL import Image

    from dit_trainer.images import class_folders

    for folder in ("cat", "dog", ".ipynb_checkpoints", "empty", "notes"):
        (tmp_path / folder).mkdir()
    for folder in ("cat", "dog", ".ipynb_checkpoints"):
        Image.new("RGB", (8, 8)).save(tmp_path / folder / "0.png")
    (tmp_path / "notes" / "readme.txt").write_text("not an image")
    (tmp_path / "notes" / "._0.png").write_bytes(b"macOS metadata, not an image")
    assert class_folders(tmp_path) == ["cat", "dog"]
    cfg = compose_config([*TINY_SHAPES, *class_conditional(tmp_path, "trainer.sample_prompts=[cat,1]")])
    assert cfg.conditioner.classes == ["cat", "dog"]


def _cat_and_dog(folder):
    from PIL import Image

    for name in ("cat", "dog"):
        (folder / name).mkdir(parents=True)
        Image.new("RGB", (16, 16)).save(folder / name / "0.png")
    return folder


def test_prompts_that_are_no_classes_are_refused_naming_the_key_that_set_them(tmp_path):
    """The reward monitor's prompts were reported as `trainer.sample_prompts`; GRPO's were not checked at all, and
    failed once the models had loaded."""
    data = _cat_and_dog(tmp_path / "data")
    run = class_conditional(data, "trainer.sample_prompts=[cat]")
    monitored = ["monitor.reward.enabled=true", "monitor.reward.prompt_file=null", "monitor.reward.prompts=[cat,bird]"]
    with pytest.raises(ConfigError, match=r"`monitor\.reward\.prompts` is \['bird'\].*`monitor\.reward\.prompts=\[0,1"):
        compose_config([*TINY_SHAPES, *run, *monitored])
    (tmp_path / "trained").mkdir()
    grpo = ["trainer.method=grpo", f"model.pretrained={tmp_path / 'trained'}", "grpo.prompts=[1,dog,bird,fish]"]
    with pytest.raises(ConfigError, match=r"`grpo\.prompts` is \['bird', 'fish'\]"):
        compose_config([*TINY_SHAPES, *run, *grpo])
