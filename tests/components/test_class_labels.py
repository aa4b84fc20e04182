"""Class labels as the condition (``components/class_labels.py``): the classes of a class-conditional run are read
from the data's sub-folders, and what does not fit class conditioning is refused."""

import pytest

from dit_trainer.errors import ConfigError

from ..conftest import TINY_SHAPES, class_conditional, compose_config

DIGIT_CLASSES = [str(digit) for digit in range(10)]


def test_classes_are_read_from_the_sub_folders_and_checked(digits):
    cfg = compose_config([*TINY_SHAPES, *class_conditional(digits)])
    assert cfg.text_encoder.classes == DIGIT_CLASSES
    with pytest.raises(ConfigError, match=r"`text_encoder\.kind`.*conditioned on class labels"):
        compose_config([*TINY_SHAPES, "model.family=dit"])
    with pytest.raises(ConfigError, match=r"`text_encoder\.kind`.*conditioned on text"):
        compose_config([*TINY_SHAPES, *class_conditional(digits), "model.family=pixart_alpha"])
    with pytest.raises(ConfigError, match=r"`trainer\.sample_prompts`.*\['cat'\].*class names or ids"):
        compose_config([*TINY_SHAPES, *class_conditional(digits), "trainer.sample_prompts=[cat]"])
    with pytest.raises(ConfigError, match=r"`privacy\.mode` is 'ghost'.*privacy\.mode=hooks"):
        compose_config([*TINY_SHAPES, *class_conditional(digits), "privacy.enabled=true", "privacy.noise_multiplier=1"])
