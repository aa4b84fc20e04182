"""Data: sources (each yields ``{"image": (3, H, W), "caption": str}``, the image uint8 when decoded from a file or
float in [-1, 1] when made procedurally (``dit_trainer.pixels.to_model_range`` takes either, on the device), plus
``"bad_files"``, the unreadable files skipped to produce it, when there were any), transforms, buckets, mixtures,
caches, the held-out split, and the loading that assembles them into a run's DataLoader (``loading``). The sources
are in ``sources/``, the on-disk cache of their encodings in ``cache/``.

``SOURCES`` is the registry ``data.source`` names, each entry a ``source.Source`` imported on first use: adding a
source is its module, one entry here and one YAML file in ``configs/data/`` (or, outside this package,
``data.source=package.module:SOURCE``).
"""

from dit_trainer.config import DataConfig
from dit_trainer.registry import Registry

SOURCES = Registry(
    "data.source",
    {
        "shapes": "dit_trainer.data.sources.shapes:SOURCE",
        "moving_shapes": "dit_trainer.data.sources.moving_shapes:SOURCE",
        "videofolder": "dit_trainer.data.sources.videofolder:SOURCE",
        "imagefolder": "dit_trainer.data.sources.imagefolder:SOURCE",
        "hf": "dit_trainer.data.sources.hf:SOURCE",
        "webdataset": "dit_trainer.data.sources.webdataset:SOURCE",
    },
    kind="dit_trainer.data.sources.source:Source",
)


def configured_sources(data: DataConfig) -> list[str]:
    """The ``data.source`` names a data section reads: each mixture entry's, or its one source."""
    return [entry.source for entry in data.mixture] or [data.source]
