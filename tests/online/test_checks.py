"""The online methods' shared checks (``online/checks.py``): prompts a training or gold reward cannot score are
refused with the config, not found in the first rollout's traceback."""

import pytest

from dit_trainer.errors import ConfigError
from dit_trainer.online.checks import check_judged

from ..conftest import one_paragraph


@pytest.mark.parametrize("reward", ["shapes_margin", "shapes_alignment"])
def test_a_prompt_the_shapes_judge_cannot_read_is_refused_naming_the_form_it_reads(reward):
    """``shapes_margin`` raised KeyError on "a big blue circle" after a whole rollout; ``shapes_alignment`` scored
    every such image 0."""
    prompts = ["a red circle", "a red hexagon", "a big blue circle", "a zzz"]
    with pytest.raises(ConfigError) as refused:
        check_judged([reward], "grpo.prompts", prompts, prompts)
    message = one_paragraph(refused.value, "grpo.prompts")
    assert f"`{reward}` cannot score an image for 3 of its prompts ('a red hexagon', 'a big blue circle'" in message
    assert '"a COLOUR SHAPE"' in message and "triangle" in message
    check_judged([reward, "jpeg_compressibility"], "grpo.prompts", prompts[:1], prompts[:1])
