"""The ``data`` and ``validation`` sections' checks: every source named is registered and gets the path it needs
(checked by the source itself) and none it would ignore, a mixture mixes only what can be mixed, buckets fit the
source (their sizes fit the models: ``components.geometry.check_bucket_sizes``), caption tools have text captions to
work on, and validation has held-out images from exactly one place."""

from __future__ import annotations

from dit_trainer.config import ConditionerConfig, DataConfig, DiffusionConfig, PrivacyConfig, ValidationConfig
from dit_trainer.data import SOURCES, configured_sources
from dit_trainer.data.captions import check_caption_tools
from dit_trainer.data.mixture import source_names
from dit_trainer.errors import require


def check_data(
    privacy: PrivacyConfig,
    conditioner: ConditionerConfig,
    data: DataConfig,
    diffusion: DiffusionConfig,
    validation: ValidationConfig,
) -> None:
    """The data a method that reads a data set trains (and validates) on."""
    if data.mixture:
        _check_mixture(privacy, data, validation)
    else:
        _check_source_path(data.source, data.path, "data.path")
    if data.buckets != "none":
        _check_buckets(privacy, data)
    if data.frames > 1:
        _check_clips(data)
    check_caption_tools(conditioner, data)
    if validation.every_n_steps:
        _check_validation(data, diffusion, validation)


def _check_source_path(name: str, path: str | None, key: str) -> None:
    source = SOURCES.get(name)
    if source.path_meaning is None:  # silently unread, a path would leave the user training on other data
        require(
            not path,
            key,
            path,
            f"`data={name}` takes no path (it would be ignored)",
            f"remove `{key}`, or name the source that reads it (e.g. `data=imagefolder {key}=...`)",
        )
        return
    override = f"{key}={source.path_example}"
    if "'" in override:  # a value quoted for Hydra (a shard pattern): the shell needs the whole override quoted too
        override = f'"{override}"'
    require(
        bool(path), key, path, f"`data={name}` needs {source.path_meaning}", f"add `{override}` to the command line"
    )
    if source.check_path is not None:
        source.check_path(path, key)


def _check_clips(data: DataConfig) -> None:
    """Clips of ``data.frames`` frames come from sources of clips, one source at a time."""
    for name in configured_sources(data):
        require(
            SOURCES.get(name).clips,
            "data.frames",
            data.frames,
            f"`data={name}` reads images, one frame each",
            "set `data.frames=1`, or read clips (`data=videofolder`, `data=webdataset` shards of videos, or the "
            "embedded `data=moving_shapes`)",
        )
    require(
        not data.mixture,
        "data.mixture",
        data.mixture,
        "a mixture of clip sources is not supported yet",
        "remove `data.mixture`",
    )


def _check_mixture(privacy: PrivacyConfig, data: DataConfig, validation: ValidationConfig) -> None:
    """A mixture's entries name their sources' paths; the settings that need one source (or a stream-free
    sampler, or, with a stream among the entries, items that can be counted) are refused with it."""
    key = "data.mixture"
    for position, entry in enumerate(data.mixture):
        _check_source_path(entry.source, entry.path, f"{key}[{position}].path")
    names = source_names(data.mixture)
    for position, (name, entry) in enumerate(zip(names, data.mixture)):
        require(
            name not in names[:position],
            f"{key}[{position}].name",
            name,
            f"entry {names.index(name)} is called that too, and the logs and the `data/skipped/<name>` metrics tell "
            "entries apart by name",
            f"give each entry a `name` of its own (unset, it is `<source><position>`: `{entry.source}{position}`)",
        )
    streamed = next((entry.source for entry in data.mixture if SOURCES.get(entry.source).streamed), None)
    if streamed is not None:
        _check_stream_mixture(data, validation, streamed)
    for name, value, reason, fix in (
        ("data.path", data.path, "the entries name their own paths", "remove `data.path`"),
        (
            "data.cache_dir",
            data.cache_dir,
            "a disk cache is not supported yet",
            "cache in memory instead (`data.cache_latents=true`), or precompute and train on one data set",
        ),
        (
            "privacy.enabled",
            privacy.enabled,
            "DP's Poisson sampling draws every image with the same probability, so it cannot weight sources",
            "train one data set under DP",
        ),
        (
            "validation.path",
            validation.path,
            "validation images are held out of the mixture's own data sets",
            "set `validation.split=0.01` and `validation.path=null`",
        ),
    ):
        require(not value, name, value, f"with `data.mixture`, {reason}", fix)


def _check_stream_mixture(data: DataConfig, validation: ValidationConfig, streamed: str) -> None:
    """A mixture with a stream is one endless stream whose items are drawn one by one: it has no epoch to hold
    images out of or to encode once, and its batches are not assembled bucket by bucket."""
    reason = f"with a stream (`{streamed}`) among them, the entries of `data.mixture` are one endless stream of items"
    require(
        data.buckets == "none",
        "data.buckets",
        data.buckets,
        f"{reason}, drawn one at a time and not batched bucket by bucket",
        "set `data.buckets=none`",
    )
    require(
        not (validation.every_n_steps and validation.split),
        "validation.split",
        validation.split,
        f"{reason}, with no index to hold images out by",
        "set `validation.every_n_steps=0`",
    )
    require(
        not data.cache_latents,
        "data.cache_latents",
        data.cache_latents,
        f"{reason}, with no end to encode once",
        "set `data.cache_latents=false`",
    )


def _check_buckets(privacy: PrivacyConfig, data: DataConfig) -> None:
    """Buckets need a source that reads image sizes and batches that can be made one bucket at a time (that their
    sizes cut into whole patches is for the models to say: ``components.checks``)."""
    sources = configured_sources(data)
    square = next((name for name in sources if not SOURCES.get(name).bucketed), None)
    require(
        square is None,
        "data.buckets",
        data.buckets,
        f"`{square}` gives square images of one size, so every image would land in one bucket",
        "use buckets with a folder or data set of real images (`data=imagefolder`, `data=hf`), or set "
        "`data.buckets=none`",
    )
    require(
        not privacy.enabled,
        "data.buckets",
        data.buckets,
        "DP's Poisson sampling draws every image independently at every step, so a batch cannot be kept to one bucket",
        "set `data.buckets=none` under `privacy.enabled=true`",
    )


def _check_validation(data: DataConfig, diffusion: DiffusionConfig, validation: ValidationConfig) -> None:
    """Validation needs held-out data: a fraction of a random-access data set, or a folder of its own."""
    v, source = validation, SOURCES.get(data.source)
    require(
        (v.split > 0) != bool(v.path),
        "validation.split",
        v.split,
        f"validation needs held-out images from exactly one place (`validation.path` is {v.path!r})",
        "hold out a fraction of the data (`validation.split=0.01`) or name a folder (`validation.path=...` with "
        "`validation.split=0`)",
    )
    require(
        v.split == 0 or not source.streamed,
        "validation.split",
        v.split,
        f"`data={data.source}` is streamed, and a stream has no items to hold out by index",
        "write held-out shards and set `validation.path=<their brace pattern>` with `validation.split=0`",
    )
    require(
        not (v.path and data.cache_dir),
        "validation.path",
        v.path,
        "training from a latent cache (`data.cache_dir`) loads neither the VAE encoder nor the text encoder, so "
        "images outside the cache cannot be validated",
        "hold out part of the cached data instead (`validation.split=0.01`, `validation.path=null`)",
    )
    require(
        v.timesteps <= diffusion.num_train_timesteps,
        "validation.timesteps",
        v.timesteps,
        f"there are only {diffusion.num_train_timesteps} training timesteps to stratify",
        f"set `validation.timesteps={min(8, diffusion.num_train_timesteps)}`",
    )
    if v.path and source.check_path is not None:
        source.check_path(v.path, "validation.path")
