"""Prompt files: one prompt per line, in UTF-8."""

from dit_trainer.prompts import load_prompts


def test_a_prompt_file_with_a_byte_order_mark_gives_clean_prompts(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes("\ufeffa red circle\r\n一只猫 🐱\n\n".encode())
    assert load_prompts([], str(prompts)) == ["a red circle", "一只猫 🐱"]
