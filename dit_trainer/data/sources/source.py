"""What a data source (an entry of ``SOURCES``) tells the rest of the package, and ``build_dataset``, which builds
the configured one (or the mixture of several)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from dit_trainer.config import DataConfig, MixtureSource
from dit_trainer.data import SOURCES
from dit_trainer.data.mixture import entry_config, mix
from dit_trainer.errors import ConfigError


@dataclass(frozen=True)
class Source:
    """How to build a source from ``DataConfig`` and what it needs of the config; what it can do (streamed,
    bucketed); and, for a procedural source whose images can be judged, how to judge a run trained on it."""

    build: Callable[[DataConfig], Dataset]
    path_meaning: str | None = None  # completes "`data=NAME` needs ..."; None: it takes no data.path
    path_example: str | None = None
    check_path: Callable[[str, str], None] | None = None  # (path, its key): a cheap check before any model is built
    # An IterableDataset split across processes, with no random access (so no Poisson sampling for DP); its
    # ``unsharded()`` reads it whole on one process (validation).
    streamed: bool = False
    bucketed: bool = False  # its items can come at any (height, width) and it reads image sizes: `data.buckets`
    # Its items are clips, (3, F, H, W) of `data.frames` frames (with `data.frames=1`, single frames (3, H, W)).
    clips: bool = False
    caption_prefix: bool = False  # it puts `data.caption_prefix` before the captions it reads (``augmentation``)
    # Whether its items make random choices when read (a random crop, a flip, one caption of several, a clip's
    # start): a random-access source's are then drawn by item and epoch (``seeded_items``), so a resume repeats them.
    random_reads: Callable[[DataConfig], bool] = lambda cfg: False
    # What identifies the data beyond its config, for the cache fingerprint: cheap (no image is read), so None
    # where the config alone determines the data (shapes).
    content: Callable[[DataConfig], dict] | None = None
    # Every caption of a data set with a closed set of them: what evaluate.py judges a run on by default.
    captions: Callable[[], list[str]] | None = None
    # Metrics read from generated images and their prompts (shapes: colour and shape accuracy), for evaluate.py.
    judge: Callable[[torch.Tensor, list[str]], dict[str, float]] | None = None


def augmentation(cfg: DataConfig) -> dict:
    """How a file-based source reads an image and its caption: the crop, the flip, several caption columns, the
    caption's prefix."""
    return {
        "crop": cfg.crop,
        "horizontal_flip": cfg.horizontal_flip,
        "caption_columns": cfg.caption_columns,
        "caption_prefix": cfg.caption_prefix,
    }


def random_augmentation(cfg: DataConfig) -> bool:
    """Whether ``augmentation(cfg)`` draws at random: a random crop, a flip, one caption of several."""
    return cfg.crop == "random" or cfg.horizontal_flip or len(cfg.caption_columns) > 1


def reads_at_random(cfg: DataConfig) -> bool:
    """Whether the items of ``cfg``'s source, or of any source of its mixture, make random choices when read."""
    entries = [entry_config(cfg, entry) for entry in cfg.mixture] or [cfg]
    return any(SOURCES.get(entry.source).random_reads(entry) for entry in entries)


def trained_content(cfg: DataConfig) -> dict | None:
    """What the data a run trains on hold beyond their config (a folder's metadata, a saved data set's fingerprint),
    by source of a mixture; None when nothing can say it cheaply: the config alone determines the data (shapes),
    a stream checks its own shards at a resume, and a run from a latent cache reads only the cache, whose
    fingerprint checked the data when it was opened."""
    if cfg.cache_dir:
        return None
    entries = [entry_config(cfg, entry) for entry in cfg.mixture] or [cfg]
    sources = [SOURCES.get(entry.source) for entry in entries]
    if any(source.streamed for source in sources) or not any(source.content for source in sources):
        return None
    return {"sources": [source.content(entry) if source.content else None for source, entry in zip(sources, entries)]}


def build_dataset(cfg: DataConfig) -> Dataset:
    """The source ``cfg.source`` names, or the mixture of ``cfg.mixture``'s. ``webdataset`` is an
    ``IterableDataset`` (no ``len``), sharded by the torch.distributed rank of this process, and so is a mixture
    with one; the others are map-style."""
    if cfg.mixture:
        entries = [_entry_dataset(cfg, position) for position in range(len(cfg.mixture))]
        return mix(entries, cfg)
    return SOURCES.get(cfg.source).build(cfg)


def _entry_dataset(cfg: DataConfig, position: int) -> Dataset:
    """The data set of ``data.mixture[position]``; what its source says about a setting the entry has of its own
    (its path: a bad metadata line, no images; its caption or image column, its split) names the entry's key, the
    one the user set, not `data.path` or `data.caption_column`."""
    try:
        return build_dataset(entry_config(cfg, cfg.mixture[position]))
    except ConfigError as error:
        own = error.key.removeprefix("data.")
        if own not in {field.name for field in dataclasses.fields(MixtureSource)}:
            raise
        raise error.renamed(f"data.mixture[{position}].{own}") from error
