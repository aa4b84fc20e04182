"""A folder of images described by ``metadata.jsonl`` (the Hugging Face ``imagefolder`` convention)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from dit_trainer.data.collate import SkipUnreadable
from dit_trainer.data.transforms import caption_keys, decode_image, pick_caption
from dit_trainer.errors import ConfigError


def check_image_folder(path: str) -> None:
    """``data.path`` holds a metadata.jsonl: checked with the config, before any model is built."""
    folder = Path(path).expanduser()
    if not (folder / "metadata.jsonl").is_file():
        raise ConfigError(
            "data.path",
            str(folder),
            "no metadata.jsonl was found there (one JSON object per image with `file_name` and a caption column)",
            "point `data.path` at the folder that holds metadata.jsonl and the images",
        )


class ImageFolderDataset(SkipUnreadable):
    """Images listed in ``root/metadata.jsonl`` (``{"file_name": ..., "<caption_column>": ...}`` per line).

    Only listed files are used, so stray files in the folder never leak into training. A listed file that cannot
    be read is skipped and reported in ``"bad_files"`` (see ``SkipUnreadable``); a bad metadata line is an error.
    """

    def __init__(
        self,
        root: str | Path,
        resolution: int,
        caption_column: str = "text",
        crop: str = "center",
        horizontal_flip: bool = False,
        caption_columns: Sequence[str] = (),
    ) -> None:
        self.root = Path(root).expanduser()
        self.path = str(self.root)
        self.resolution, self.crop, self.horizontal_flip = resolution, crop, horizontal_flip
        self.records = self._read_metadata(self.root / "metadata.jsonl", *caption_keys(caption_column, caption_columns))

    @staticmethod
    def _read_metadata(path: Path, key: str, columns: list[str]) -> list[tuple[str, tuple[str, ...]]]:
        records = []
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ConfigError(
                        "data.path",
                        str(path.parent),
                        f"line {number} of metadata.jsonl is not JSON ({error.msg})",
                        "fix or remove that line",
                    ) from error
                if "file_name" not in row or any(column not in row for column in columns):
                    raise ConfigError(
                        key,
                        columns if key == "data.caption_columns" else columns[0],
                        f"line {number} of {path} has keys {sorted(row)}; each line needs `file_name` "
                        f"and the caption column(s)",
                        f"set `{key}` to the key(s) holding captions",
                    )
                records.append((str(row["file_name"]), tuple(row[column] for column in columns)))
        if not records:
            raise ConfigError(
                "data.path",
                str(path.parent),
                "its metadata.jsonl lists no images",
                "add one line per image with `file_name` and a caption",
            )
        return records

    def __len__(self) -> int:
        return len(self.records)

    def name(self, index: int) -> str:
        return self.records[index][0]

    def read(self, index: int) -> tuple[Image.Image, str]:
        file_name, captions = self.records[index]
        return decode_image((self.root / file_name).read_bytes()), pick_caption(captions)
