"""What may change when a run resumes: how fast, how long or what is watched may; what is trained (the model, its
data and held-out images, its objective, its method and the sections that method trains by) may not, unless the
user says so."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from dit_trainer.config import section_types

SECTIONS = section_types()
# What each section declares of itself (``config/schema.py``): what resuming changes, what defines the trained thing
# (whole sections, or single keys of the others), and, of the defining sections, what may change without changing it.
RESUMING_KEYS = tuple(f"trainer.{key}" for key in sorted(SECTIONS["trainer"].RESUMING))
DEFINING_SECTIONS = tuple(name for name, section in SECTIONS.items() if getattr(section, "DEFINES_TRAINING", False))
DEFINING_KEYS = {f"{name}.{key}" for name, section in SECTIONS.items() for key in getattr(section, "DEFINING", ())}
OPERATIONAL_KEYS = {
    f"{name}.{key}" for name, section in SECTIONS.items() for key in getattr(section, "MAY_CHANGE_ON_RESUME", ())
}


def _flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_changes(saved: dict, current: dict) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, current)}`` for every setting that differs, except those resuming is meant to change."""
    old, new = _flatten(saved), _flatten(json.loads(json.dumps(current, default=str)))
    keys = sorted((old.keys() | new.keys()) - set(RESUMING_KEYS))
    return {key: (old.get(key), new.get(key)) for key in keys if old.get(key) != new.get(key)}


def defines_training(key: str, saved: Any = None, current: Any = None, method_sections: Sequence[str] = ()) -> bool:
    """Whether changing ``key`` from ``saved`` to ``current`` changes what is trained (the model, its data and the
    images held out of it, its objective, the method and where it started; ``method_sections``: the sections the
    run's method trains by, its own and the rewards it trains on), as opposed to how fast, how long or what is
    watched."""
    section = key.split(".")[0]
    if key in OPERATIONAL_KEYS:
        return False
    if key == "validation.every_n_steps":  # turned on or off: images are held out of training, or no longer
        return bool(saved) != bool(current)
    return key in DEFINING_KEYS or section in (*DEFINING_SECTIONS, *method_sections)


def config_hash(config: dict) -> str:
    """A short fingerprint of the training config, ``RESUMING_KEYS`` excluded (checkpoints written before they
    recorded their whole config compare this)."""
    trainer = {k: v for k, v in config["trainer"].items() if f"trainer.{k}" not in RESUMING_KEYS}
    text = json.dumps({**config, "trainer": trainer}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
