"""A disk cache's fingerprint: everything that shaped its tensors (the VAE, the conditioner, how images and
captions were read, the bucket sizes, the data's content), recorded in its index by precompute and compared by every
run that reads it, so that a cache made with other settings or from other data is refused, never trained on."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

from dit_trainer.config import ConditionerConfig, DataConfig, VAEConfig
from dit_trainer.config.recorded import relocated_paths, with_absolute_paths
from dit_trainer.data import SOURCES
from dit_trainer.data.buckets import BucketTable, require_table_of
from dit_trainer.errors import ConfigError, shortlist

FORMAT_VERSION = 2  # 2: the fingerprint holds the text encoder's tokenizer_subfolder and the data's content
ENCODER_KEYS = ("pretrained", "kind", "subfolder", "tokenizer_subfolder", "revision", "max_length")  # format 2's
# Settings that change nothing in the cached tensors: reading options and training-time augmentation knobs.
NOT_FINGERPRINTED = (
    "caption_dropout",
    "max_bad_fraction",
    "num_workers",
    "prefetch_factor",
    "cache_latents",
    "cache_dir",
    "cache_shard_size",
    "shuffle_buffer",
    "shuffle_tags",  # the per-step tag draws, refused with a cache (``captions.check_caption_tools``)
    "keep_tags",
    "tag_dropout",
)
# Data settings added since format 2 that shape the tensors: counted only away from their defaults, so that caches
# written before they existed still match.
ADDED_DATA_KEYS = {"caption_prefix": "", "frames": 1, "fps": None}


def cache_fingerprint(
    data: DataConfig, vae: VAEConfig, conditioner: ConditionerConfig, buckets: BucketTable | None
) -> dict:
    """Everything that shaped the cached tensors: the VAE, the text encoder, how images and captions were read, and
    what the source holds (its ``content``: a folder that grew since must not reuse the cache). ``buckets``: the
    run's table (``components.geometry.configured_buckets``), whose sizes depend on the VAE and the patch size too."""
    read = {
        k: v
        for k, v in asdict(data).items()
        if k not in NOT_FINGERPRINTED and not (k in ADDED_DATA_KEYS and v == ADDED_DATA_KEYS[k])
    }
    text, defaults = asdict(conditioner), asdict(ConditionerConfig())
    # Settings added since format 2 (pooling, ...) count only away from their defaults, so older caches still match.
    encoder = {k: v for k, v in text.items() if k in ENCODER_KEYS or (k != "memo_size" and v != defaults[k])}
    fingerprint = {
        "format": FORMAT_VERSION,
        "vae": asdict(vae),
        "text_encoder": encoder,  # the section's name when format 2 began (see `_config_key`)
        "data": read,
    }
    require_table_of(data.buckets, buckets)
    if buckets is not None:
        fingerprint["bucket_sizes"] = [list(size) for size in buckets.sizes]
    content = SOURCES.get(data.source).content
    return fingerprint | ({"data_content": content(data)} if content else {})


def _config_key(difference: str) -> str:
    """A fingerprint difference named by the config key that changes it: the conditioner's settings are recorded
    under ``text_encoder`` (the section's name when cache format 2 began), so caches written before the rename
    still match."""
    return re.sub(r"^text_encoder\.", "conditioner.", difference)


def _differences(saved: dict, wanted: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(saved) | set(wanted))
    found = []
    for key in keys:
        a, b = saved.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append(f"{prefix}{key}: cache {a!r}, config {b!r}")
    return found


def check_fingerprint(index: dict, fingerprint: dict, cache_dir: Path) -> None:
    """Refuse a cache made with other settings or from other data (``fingerprint``: this run's
    ``cache_fingerprint``): training on it would silently learn from the wrong inputs."""
    saved, _ = relocated_paths(index["fingerprint"])  # its shipped models' paths, of an install since moved
    if isinstance(saved, dict):  # relative model paths, recorded before configs made them absolute
        saved = with_absolute_paths(saved, (("vae", "pretrained"), ("text_encoder", "pretrained")))
    if not isinstance(saved, dict) or saved.get("format") != FORMAT_VERSION:
        version = saved.get("format") if isinstance(saved, dict) else None
        age = "an older" if isinstance(version, int) and version < FORMAT_VERSION else "another"
        raise ConfigError(
            "data.cache_dir",
            str(cache_dir),
            f"the cache was written by {age} version of dit-trainer (cache format {version}; this one reads format "
            f"{FORMAT_VERSION}, whose fingerprint also covers the data's content)",
            "write the cache again with `python scripts/precompute.py <the same overrides as train.py>` into a new "
            "folder (or delete this one first)",
        )
    differences = [_config_key(difference) for difference in _differences(saved, fingerprint)]
    if differences:
        shown = shortlist(differences, 4, "; ")
        raise ConfigError(
            "data.cache_dir",
            str(cache_dir),
            f"the cache was made with other settings than this run's ({shown})",
            "train with the settings the cache was made with, or write a new cache for these settings with "
            "`python scripts/precompute.py ... data.cache_dir=<new folder>`",
        )
