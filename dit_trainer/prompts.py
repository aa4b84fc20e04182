"""Prompt lists from the config: ``prompts`` inline, or ``prompt_file`` with one prompt per line."""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from pathlib import Path

from dit_trainer.config import RewardMonitorConfig
from dit_trainer.errors import ConfigError


def load_prompts(prompts: list[str], prompt_file: str | None, prefix: str = "") -> list[str]:
    """The prompts of ``prompt_file`` (one per line, blank lines skipped) if set, else ``prompts``.

    ``prefix`` is where the two keys live in the config (``monitor.reward.``), so errors name the key to fix.
    """
    if prompt_file:
        lines = _read_text(prompt_file, f"{prefix}prompt_file").splitlines()
        prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        raise ConfigError(
            f"{prefix}prompt_file" if prompt_file else f"{prefix}prompts",
            prompt_file or list(prompts),
            "no prompts were given (the file is empty, or neither prompt_file nor prompts is set)",
            f"pass `{prefix}prompt_file=FILE` with one prompt per line, or `{prefix}prompts=[...]`",
        )
    return list(prompts)


def reward_monitor_prompts(reward: RewardMonitorConfig) -> list[str]:
    """The prompts the reward monitor samples (none while it is off): read once into the run's plan, which the
    monitor and the disk cache's prompt check both take."""
    return load_prompts(reward.prompts, reward.prompt_file, "monitor.reward.") if reward.enabled else []


def sampled_prompts(sample_prompts: Sequence[str], reward_prompts: Sequence[str]) -> list[str]:
    """Every prompt a run samples or drops captions to, once each: "" (caption dropout, CFG), the sample grid's and
    the reward monitor's (``reward_monitor_prompts``). A disk cache holds them embedded besides its captions."""
    return list(dict.fromkeys(["", *sample_prompts, *reward_prompts]))


def _read_text(prompt_file: str, key: str) -> str:
    """The file's text, decoded as UTF-8 (a leading byte-order mark dropped, so it never starts the first prompt)."""
    path = Path(prompt_file).expanduser()
    if not path.is_file():
        raise ConfigError(key, prompt_file, "no such file", "pass a text file with one prompt per line")
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ConfigError(
            key,
            prompt_file,
            f"it is not UTF-8 text (byte {data[error.start]:#04x} on line {line})",
            "save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8 FILE > NEW`), one prompt per line",
        ) from error
