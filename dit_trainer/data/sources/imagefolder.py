"""A folder of images described by ``metadata.jsonl`` (the Hugging Face ``imagefolder`` convention)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from PIL import Image, UnidentifiedImageError

from dit_trainer.config import DataConfig
from dit_trainer.data.collate import SkipUnreadable
from dit_trainer.data.image_sizes import Size, declared_size
from dit_trainer.data.sources.source import Source, augmentation, random_augmentation
from dit_trainer.data.sources.transforms import (
    UNREADABLE_ERRORS,
    VIDEO_SUFFIXES,
    UnfitFile,
    caption_keys,
    decode_image,
    header_size,
    json_type,
    pick_caption,
)
from dit_trainer.errors import ConfigError, shortlist
from dit_trainer.images import class_folders, image_names, is_image_name

logger = logging.getLogger(__name__)
METADATA = "metadata.jsonl"


def class_folder_records(folder: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(file, (class name,)) for every image in the class sub-folders of ``folder`` (nested folders included), the
    class being the sub-folder's name (torchvision's ``ImageFolder`` layout; ``class_folders`` says which are
    classes), sorted by class then path."""
    return [(f"{name}/{image}", (name,)) for name in class_folders(folder) for image in image_names(folder / name)]


def check_image_folder(path: str, key: str = "data.path") -> None:
    """``key`` (``data.path``, ``validation.path``) holds a metadata.jsonl, or class sub-folders of images: checked
    with the config, before any model is built."""
    folder = Path(path).expanduser()
    if (folder / METADATA).is_file() or (folder.is_dir() and class_folder_records(folder)):
        return
    raise ConfigError(
        key,
        str(folder),
        "no metadata.jsonl was found there (one JSON object per image with `file_name` and a caption column), nor "
        "sub-folders of images (one per class)",
        f"point `{key}` at the folder that holds metadata.jsonl and the images, or the class sub-folders",
    )


def metadata_fingerprint(path: str) -> dict:
    """The number of entries of metadata.jsonl (or of the class folders' images) and a hash of it: a folder whose
    list of images or captions changed gets another one. Images replaced in place under the same names do not
    (telling would mean reading them all)."""
    folder, digest, entries = Path(path).expanduser(), hashlib.sha256(), 0
    if not (folder / METADATA).is_file():
        records = class_folder_records(folder)
        digest.update(json.dumps(records).encode())
        return {"entries": len(records), "class_folders_sha256": digest.hexdigest()}
    with (folder / METADATA).open("rb") as lines:
        for line in lines:
            digest.update(line)
            entries += bool(line.strip())
    return {"entries": entries, "metadata_sha256": digest.hexdigest()}


def metadata_row(raw: bytes, number: int, folder: Path) -> dict | None:
    """Line ``number`` of metadata.jsonl as a JSON object (None when blank); anything else is a ``ConfigError``
    naming the line, not a traceback from deep inside the data loader."""

    def refused(reason: str) -> ConfigError:
        fix = "fix or remove that line (one JSON object per image, saved as UTF-8)"
        return ConfigError("data.path", str(folder), f"line {number} of {METADATA} {reason}", fix)

    try:
        line = raw.decode("utf-8").removeprefix("\ufeff")  # the byte-order mark some editors write
    except UnicodeDecodeError as error:
        raise refused(f"is not UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1})") from error
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise refused(f"is not JSON ({error.msg})") from error
    if not isinstance(row, dict):
        raise refused(f'is a JSON {json_type(row)}, not an object like {{"file_name": ..., "text": ...}}')
    return row


def outside(name: str) -> bool:
    """Whether a file name of metadata.jsonl points outside the folder before any link is followed: absolute, or
    climbing out with ``..``."""
    return os.path.isabs(name) or os.path.normpath(name).split(os.sep)[0] == os.pardir


def open_inside(real_root: Path, name: str) -> BinaryIO:
    """``real_root / name`` opened for reading, when it is a regular file inside ``real_root`` (a resolved path)
    with links followed. A link out of the folder is not read (a run reads only the data it was given), nor is a
    FIFO, a device or a folder, which would block the loader, never end, or fail obscurely; both are raised as
    unreadable files, skipped and counted, and so is a loop of links (on which ``resolve`` raises RuntimeError)."""
    try:
        path = (real_root / name).resolve()
    except RuntimeError as error:
        raise ValueError(f"a loop of links ({error})") from error
    if not path.is_relative_to(real_root):
        raise ValueError(f"a link to {path}, outside the data folder, is not followed")
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, unread
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise ValueError(f"not a regular file ({kind})")
    return os.fdopen(descriptor, "rb")


def read_metadata(
    path: Path, key: str, columns: list[str]
) -> tuple[list[tuple[str, tuple[str, ...]]], list[Size | None]]:
    """(file name, captions) of every line of a metadata.jsonl, and its declared (width, height) (None where it
    declares none); a bad line, or one naming a file outside the folder, is a ``ConfigError``."""
    records, sizes = [], []
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            row = metadata_row(raw, number, path.parent)
            if row is None:
                continue
            if "file_name" not in row:  # a line of the data set's, not of the caption setting's
                raise ConfigError(
                    "data.path",
                    str(path.parent),
                    f"line {number} of {path} has keys {sorted(row)} and no `file_name`, the image it captions",
                    "give every line of the metadata the `file_name` of its image (its path inside the folder)",
                )
            if any(column not in row for column in columns):
                raise ConfigError(
                    key,
                    columns if key == "data.caption_columns" else columns[0],
                    f"line {number} of {path} has keys {sorted(row)}; each line needs the caption column(s)",
                    f"set `{key}` to the key(s) holding captions",
                )
            name = str(row["file_name"])
            if outside(name):
                raise ConfigError(
                    "data.path",
                    str(path.parent),
                    f"line {number} of {METADATA} names {name!r}, outside that folder (an absolute path, or one "
                    "climbing out with `..`), and a data set reads only the files inside the folder it was given",
                    "move or copy the image into the folder and list it by its path there (e.g. `images/1.png`)",
                )
            records.append((name, tuple(row[column] for column in columns)))
            sizes.append(declared_size(row.get("width"), row.get("height")))
    if not records:
        raise ConfigError(
            "data.path",
            str(path.parent),
            "its metadata.jsonl lists no images",
            "add one line per image with `file_name` and a caption",
        )
    return records, sizes


class ListedFiles:
    """What aspect-ratio buckets read of a source of the files ``records`` lists under ``real_root``: the sizes its
    metadata declared (all or none: the sizes index is keyed by the files, not the metadata), and a fingerprint of
    the files for the index of the sizes read from their headers."""

    root: Path
    real_root: Path
    records: list[tuple[str, tuple[str, ...]]]
    sizes: list[Size | None]
    source_name: str  # the registry's name, in the fingerprint
    kind: str  # "images" or "clips", in messages
    read_size: Callable[[BinaryIO], Size | None]  # (width, height) from a file's header; None or an error if unreadable

    def image_size(self, index: int) -> Size | None:
        """(width, height) of item ``index``: declared, else read from its file's header; None when unreadable."""
        if self.sizes[index] is not None:
            return self.sizes[index]
        try:
            with open_inside(self.real_root, self.records[index][0]) as file:
                return self.read_size(file)
        except UNREADABLE_ERRORS:  # skipped as unreadable when its turn comes
            return None

    def keep_all_or_no_sizes(self) -> None:
        declared = len(self.sizes) - self.sizes.count(None)
        if 0 < declared < len(self.sizes):
            logger.info(
                f"{METADATA} of {self.root} gives width and height for {declared} of its {len(self.sizes)} "
                f"{self.kind}, not all: buckets read the headers instead (once: see dit_trainer.data.image_sizes)"
            )
            self.sizes = [None] * len(self.sizes)

    def declared_sizes(self) -> list[Size] | None:
        return None if None in self.sizes else list(self.sizes)

    def sizes_fingerprint(self) -> dict:
        """The listed files with their sizes and modification times (a ``stat`` each, no file opened): a file
        replaced, added or removed since the sizes index was written gets another one."""
        digest = hashlib.sha256()
        for name, _ in self.records:
            try:
                found = os.stat(self.real_root / name)
                digest.update(f"{name}\0{found.st_size}\0{found.st_mtime_ns}\n".encode())
            except OSError:  # missing: unreadable, skipped when its turn comes
                digest.update(f"{name}\0-\n".encode())
        return {"source": self.source_name, "entries": len(self.records), "files_sha256": digest.hexdigest()}


class ImageFolderDataset(ListedFiles, SkipUnreadable):
    """Images listed in ``root/metadata.jsonl`` (``{"file_name": ..., "<caption_column>": ...}`` per line), or
    without one, the images of ``root``'s sub-folders captioned with the sub-folder's name (a class).

    Only listed files are used, so stray files in the folder never leak into training. A listed file that cannot
    be read (or is no regular file inside ``root``: ``open_inside``) is skipped and reported in ``"bad_files"``
    (see ``SkipUnreadable``); a bad metadata line, or one naming a file outside ``root``, is an error. ``width`` and
    ``height`` on every line (as img2dataset writes them) spare buckets reading the images' headers.
    """

    source_name, kind, read_size = "imagefolder", "images", staticmethod(header_size)

    def __init__(
        self,
        root: str | Path,
        resolution: int,
        caption_column: str = "text",
        crop: str = "center",
        horizontal_flip: bool = False,
        caption_columns: Sequence[str] = (),
        caption_prefix: str = "",
    ) -> None:
        self.root = Path(root).expanduser()
        self.real_root = self.root.resolve()
        self.path = str(self.root)
        self.resolution, self.crop, self.horizontal_flip = resolution, crop, horizontal_flip
        self.caption_prefix = caption_prefix
        metadata = self.root / METADATA
        if metadata.is_file():
            self.records, self.sizes = read_metadata(metadata, *caption_keys(caption_column, caption_columns))
            self.keep_all_or_no_sizes()
        else:
            self.records = class_folder_records(self.root)
            self.sizes = [None] * len(self.records)
            classes = {captions[0] for _, captions in self.records}
            ignored = sorted(e.name for e in self.root.iterdir() if e.is_dir() and e.name not in classes)
            if ignored:
                logger.warning(
                    f"sub-folders of {self.root} that are hidden or hold no images are no classes and are ignored: "
                    f"{shortlist(ignored, 5)}"
                )
            loose = sorted(e.name for e in self.root.iterdir() if e.is_file() and is_image_name(e.name))
            if loose:
                logger.warning(
                    f"images directly in {self.root} are in no class folder and are ignored: {shortlist(loose, 5)}"
                )

    def __len__(self) -> int:
        return len(self.records)

    def name(self, index: int) -> str:
        return self.records[index][0]

    def read(self, index: int) -> tuple[Image.Image, str]:
        file_name, captions = self.records[index]
        with open_inside(self.real_root, file_name) as file:
            data = file.read()
        try:
            image = decode_image(data)
        except UnidentifiedImageError as error:
            if Path(file_name).suffix.lower() not in VIDEO_SUFFIXES:
                raise
            raise UnfitFile(
                "it is a video, and this source reads images",
                "data.source",
                "imagefolder",
                "read clips with `data=videofolder` and `data.frames` > 1 (a video family: `model.family=wan`)",
            ) from error
        return image, pick_caption(captions, prefix=self.caption_prefix)


def _build(cfg: DataConfig) -> ImageFolderDataset:
    return ImageFolderDataset(cfg.path, cfg.resolution, cfg.caption_column, **augmentation(cfg))


SOURCE = Source(
    _build,
    "the folder that holds your images and metadata.jsonl",
    "/path/to/images",
    check_image_folder,
    bucketed=True,
    caption_prefix=True,
    random_reads=random_augmentation,
    content=lambda cfg: metadata_fingerprint(cfg.path),
)
