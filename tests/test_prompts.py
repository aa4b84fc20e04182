"""Prompt files (``prompts.py``): one prompt per line, in UTF-8; an empty file or one in another encoding is
refused."""

import pytest

from dit_trainer.errors import ConfigError
from dit_trainer.prompts import load_prompts, sampled_prompts

from .conftest import compose_config, one_paragraph


def test_a_prompt_file_with_a_byte_order_mark_gives_clean_prompts(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes("\ufeffa red circle\r\n一只猫 🐱\n\n".encode())
    assert load_prompts([], str(prompts)) == ["a red circle", "一只猫 🐱"]


def test_an_empty_prompt_file_is_refused(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n  \n")
    with pytest.raises(ConfigError, match="no prompts were given"):
        compose_config(["+experiment=shapes", f"monitor.reward.prompt_file={prompts}"])


@pytest.mark.parametrize(
    "content",
    [b"a red circle\n\xe9t\xe9 \xe0 la plage\n", "a red circle\n".encode("utf-16")],
    ids=["latin-1", "utf-16"],
)
def test_a_prompt_file_that_is_not_utf8_is_refused(tmp_path, content):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", f"monitor.reward.prompt_file={prompts}"])
    assert "UTF-8" in one_paragraph(caught.value, "monitor.reward.prompt_file")


def test_the_sampled_prompts_start_with_the_empty_caption_and_hold_each_prompt_once():
    assert sampled_prompts(["a cat", "", "a dog"], ["a dog", "a bird"]) == ["", "a cat", "a dog", "a bird"]
