"""A Hugging Face ``datasets`` data set: a folder written by ``save_to_disk``, a local data folder, or a hub id.

``datasets`` is imported when one is built, so runs on other sources do not pay its second of import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from dit_trainer.config import DataConfig
from dit_trainer.data.collate import SkipUnreadable
from dit_trainer.data.image_sizes import Size, declared_size
from dit_trainer.data.sources.source import Source, augmentation, random_augmentation
from dit_trainer.data.sources.transforms import caption_keys, decode_image, header_size, pick_caption
from dit_trainer.errors import ConfigError


def _describe(error: BaseException) -> str:
    """The error and, when it wraps others, the innermost one: that says what is wrong (a metadata file that is not
    UTF-8) where ``DatasetGenerationError: An error occurred while generating the dataset`` does not."""
    described = f"{type(error).__name__}: {str(error)[:300]}"
    cause = error
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
    return described if cause is error else f"{described}; caused by {type(cause).__name__}: {str(cause)[:300]}"


def load_split(path: str, split: str) -> Any:
    """The ``split`` of the data set at ``path`` as a ``datasets.Dataset``; every failure is a ``ConfigError``."""
    import datasets

    local = Path(path).expanduser()
    saved = local.is_dir() and any(
        (local / name).is_file()
        for name in (datasets.config.DATASET_STATE_JSON_FILENAME, datasets.config.DATASETDICT_JSON_FILENAME)
    )
    try:
        loaded = datasets.load_from_disk(str(local)) if saved else datasets.load_dataset(path, split=split)
    except (OSError, datasets.exceptions.DatasetsError) as error:  # not found, offline, not a data set
        raise ConfigError(
            "data.path",
            path,
            f"no data set could be loaded from it ({_describe(error)})",
            "pass a folder written by `Dataset.save_to_disk`, a local data folder, or a hub id; with "
            "HF_HUB_OFFLINE=1 a hub data set must already be in the local cache (download it once online)",
        ) from error
    except ValueError as error:  # load_dataset's unknown split
        if "split" not in str(error).lower():
            raise
        raise ConfigError("data.split", split, str(error), "set `data.split` to one of the splits named") from error
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ConfigError(
                "data.split", split, f"the data set at {path} has the splits {sorted(loaded)}", "pick one of them"
            )
        loaded = loaded[split]
    elif split != "train" and str(loaded.split) != split:  # one saved data set: the default takes it whole
        raise ConfigError(
            "data.split",
            split,
            f"the data set at {path} is one split ({loaded.split or 'unnamed'}), saved without the others",
            "leave `data.split` unset to train on it, or save the data set dict (`DatasetDict.save_to_disk`)",
        )
    return loaded


def split_fingerprint(path: str, split: str) -> dict:
    """The fingerprint ``datasets`` keeps for the split (it changes whenever the data does; a saved data set reads it
    from its state file, so no image is decoded) and its number of rows."""
    dataset = load_split(path, split)
    return {"fingerprint": dataset._fingerprint, "rows": dataset.num_rows}


class HFImageDataset(SkipUnreadable):
    """Rows of a ``datasets`` split: an image column and one or more caption columns.

    Images are cast to ``datasets.Image(decode=False)`` so that decoding happens here, where an unreadable image
    is skipped and reported in ``"bad_files"`` (see ``SkipUnreadable``) rather than raised deep inside ``datasets``.
    Integer ``width`` and ``height`` columns (as img2dataset writes them) spare buckets reading the images' headers.
    """

    def __init__(
        self,
        path: str,
        resolution: int,
        split: str = "train",
        image_column: str = "image",
        caption_column: str = "text",
        crop: str = "center",
        horizontal_flip: bool = False,
        caption_columns: Sequence[str] = (),
        caption_prefix: str = "",
    ) -> None:
        import datasets

        self.path, self.resolution, self.crop, self.horizontal_flip = path, resolution, crop, horizontal_flip
        self.image_column, self.caption_prefix = image_column, caption_prefix
        key, self.caption_columns = caption_keys(caption_column, caption_columns)
        dataset = load_split(path, split)
        available = ", ".join(dataset.column_names)
        if image_column not in dataset.column_names:
            raise ConfigError(
                "data.image_column", image_column, f"the data set has the columns {available}", "name the image column"
            )
        missing = [column for column in self.caption_columns if column not in dataset.column_names]
        if missing:
            raise ConfigError(
                key,
                missing[0] if key == "data.caption_column" else self.caption_columns,
                f"the data set has no column {missing[0]!r}; its columns are {available}",
                f"set `{key}` to the column(s) holding captions",
            )
        columns = self.caption_columns
        repeated = [column for index, column in enumerate(columns) if column in columns[:index]]
        if repeated or image_column in columns:  # the columns read are selected by name, once each
            raise ConfigError(
                key if repeated else "data.image_column",
                columns if repeated else image_column,
                f"it names the column {(repeated or [image_column])[0]!r} "
                + ("twice" if repeated else "for the images and for the captions"),
                f"name each column once, images and captions apart (the columns are {available})",
            )
        self.sizes = self._declared(dataset)
        dataset = dataset.select_columns([image_column, *self.caption_columns])
        try:
            self.dataset = dataset.cast_column(image_column, datasets.Image(decode=False))
        except (ValueError, TypeError, NotImplementedError) as error:
            raise ConfigError(
                "data.image_column",
                image_column,
                f"that column holds {dataset.features[image_column]}, not images, paths or image bytes",
                f"name the image column (the columns are {available})",
            ) from error

    @staticmethod
    def _declared(dataset: Any) -> list[Size] | None:
        """Every row's (width, height) from integer ``width`` and ``height`` columns; None unless every row has both
        (a column of another meaning, floats or text, is not taken for sizes)."""
        dtypes = [str(getattr(dataset.features.get(side), "dtype", "")) for side in ("width", "height")]
        if not all(dtype.startswith(("int", "uint")) for dtype in dtypes):
            return None
        sizes = [declared_size(w, h) for w, h in zip(dataset["width"], dataset["height"])]
        return None if None in sizes else sizes

    def declared_sizes(self) -> list[Size] | None:
        return self.sizes

    def sizes_fingerprint(self) -> dict:
        """The fingerprint ``datasets`` keeps for the rows read (it changes whenever the data does)."""
        return {"source": "hf", "fingerprint": self.dataset._fingerprint, "rows": len(self.dataset)}

    def __len__(self) -> int:
        return len(self.dataset)

    def name(self, index: int) -> str:
        path = (self.dataset[index][self.image_column] or {}).get("path")
        return f"row {index}" + (f" ({path})" if path else "")

    def _image(self, row: dict) -> bytes | Path:
        image = row[self.image_column] or {}  # {"bytes": ... or None, "path": ... or None}, or a null cell
        if image.get("bytes") is not None:
            return image["bytes"]
        if image.get("path"):
            return Path(image["path"])
        raise ValueError("the row has no image")

    def image_size(self, index: int) -> tuple[int, int] | None:
        if self.sizes is not None:
            return self.sizes[index]
        try:
            return header_size(self._image(self.dataset[index]))
        except ValueError:
            return None

    def read(self, index: int) -> tuple[Image.Image, str]:
        row = self.dataset[index]
        image = self._image(row)
        data = image if isinstance(image, bytes) else image.read_bytes()
        captions = [row[column] for column in self.caption_columns]
        return decode_image(data), pick_caption(captions, prefix=self.caption_prefix)


def _build(cfg: DataConfig) -> HFImageDataset:
    return HFImageDataset(
        cfg.path, cfg.resolution, cfg.split, cfg.image_column, cfg.caption_column, **augmentation(cfg)
    )


SOURCE = Source(
    _build,
    "a dataset name on the hub or a folder written by `Dataset.save_to_disk`",
    "/path/to/dataset",
    bucketed=True,
    caption_prefix=True,
    random_reads=random_augmentation,
    content=lambda cfg: split_fingerprint(cfg.path, cfg.split),
)
