"""A folder of images described by ``metadata.jsonl`` (the Hugging Face ``imagefolder`` convention)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset

from dit_trainer.config import ConfigError
from dit_trainer.data.transforms import to_model_input


class ImageFolderDataset(Dataset):
    """Images listed in ``root/metadata.jsonl`` (``{"file_name": ..., "<caption_column>": ...}`` per line).

    Only listed files are used, so stray files in the folder never leak into training.
    """

    def __init__(self, root: str | Path, resolution: int, caption_column: str = "text", center_crop: bool = True):
        self.root = Path(root).expanduser()
        self.resolution = resolution
        self.center_crop = center_crop
        self.records = self._read_metadata(self.root / "metadata.jsonl", caption_column)

    @staticmethod
    def _read_metadata(path: Path, caption_column: str) -> list[tuple[str, str]]:
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
                if "file_name" not in row or caption_column not in row:
                    raise ConfigError(
                        "data.caption_column",
                        caption_column,
                        f"line {number} of {path} has keys {sorted(row)}; each line needs `file_name` "
                        f"and the caption column",
                        "set `data.caption_column` to the key holding captions",
                    )
                records.append((str(row["file_name"]), str(row[caption_column])))
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

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | str]:
        file_name, caption = self.records[index]
        path = self.root / file_name
        try:
            with Image.open(path) as image:
                return {"image": to_model_input(image, self.resolution, self.center_crop), "caption": caption}
        except OSError as error:  # missing, truncated or not an image (PIL's UnidentifiedImageError is an OSError)
            raise ConfigError(
                "data.path",
                str(self.root),
                f"the image {file_name} listed in metadata.jsonl cannot be read ({type(error).__name__}: {error})",
                "replace the file or remove its line from metadata.jsonl",
            ) from error
