"""Prompt lists from the config: ``prompts`` inline, or ``prompt_file`` with one prompt per line."""

from __future__ import annotations

from pathlib import Path

from dit_trainer.errors import ConfigError


def load_prompts(prompts: list[str], prompt_file: str | None, prefix: str = "") -> list[str]:
    """The prompts of ``prompt_file`` (one per line, blank lines skipped) if set, else ``prompts``.

    ``prefix`` is where the two keys live in the config (``monitor.grpo.``), so errors name the key to fix.
    """
    if prompt_file:
        path = Path(prompt_file).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"{prefix}prompt_file", prompt_file, "no such file", "pass a text file with one prompt per line"
            )
        prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ConfigError(
            f"{prefix}prompt_file" if prompt_file else f"{prefix}prompts",
            prompt_file or list(prompts),
            "no prompts were given (the file is empty, or neither prompt_file nor prompts is set)",
            f"pass `{prefix}prompt_file=FILE` with one prompt per line, or `{prefix}prompts=[...]`",
        )
    return list(prompts)
