"""Image and caption preparation shared by the file-based data sources (imagefolder, hf, webdataset)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from dit_trainer.config.choices import CROPS
from dit_trainer.data.captions import with_prefix
from dit_trainer.data.image_modes import to_rgb

# center / random: resized to cover the target size, then the target cut out; none: squashed to the target size.
# Resizing an image whole costs memory in proportion to its elongation (a 10 x 20000 strip at 1024 px: 8 GB). Up to
# this elongation relative to the target it is done as always (so the images of every earlier run come out
# bit-identical); beyond it, a window of the target's shape is cut out of the original first.
MAX_ASPECT_RESIZED_WHOLE = 16

# What PIL raises for bytes that are not a readable image: OSError (covers UnidentifiedImageError, truncated data
# and missing files), SyntaxError and ValueError (broken PNG chunks, bad headers), EOFError (cut-off frames), and
# the decompression bomb checks (absurd dimensions; ``decode_image`` turns PIL's warning into an error too).
# ValueError also covers our own "no caption" and bad-UTF-8 cases.
UNREADABLE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    Image.DecompressionBombError,
    Image.DecompressionBombWarning,
)
EXIF_ORIENTATION = 0x0112
VIDEO_SUFFIXES = (".mp4", ".webm", ".mkv", ".mov", ".avi", ".m4v", ".gif")


class UnfitFile(ValueError):
    """A file that reads, but not as this run's settings need it (a clip shorter than ``data.frames`` takes, a video
    in a source of images): the fix is the setting ``key`` (at ``value``), not the file."""

    def __init__(self, reason: str, key: str, value: object, fix: str) -> None:
        super().__init__(reason)
        self.key, self.value, self.fix = key, value, fix


JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def decode_image(data: bytes) -> Image.Image:
    """Decode every pixel now, so a truncated file fails here, inside the caller's try, not later in a transform.

    PIL reads pixels lazily, and an empty file would otherwise surface as a vague "cannot identify image file".
    EXIF orientation is applied, as ``datasets.Image`` does, so phone photos are upright in every source. An image
    above ``Image.MAX_IMAGE_PIXELS``, which PIL only warns about (up to twice that), is refused like a bigger one: a
    data loader worker decoding it could run out of memory and be killed, taking the run with it.
    """
    if not data:
        raise ValueError("empty file (0 bytes)")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        image = Image.open(io.BytesIO(data))
        image.load()
    return ImageOps.exif_transpose(image)


def header_size(data: bytes | Path | BinaryIO) -> tuple[int, int] | None:
    """(width, height) of an image as it will be decoded (EXIF rotations by 90 degrees swap them), read from its
    header only; None when the header is unreadable (the image is skipped as unreadable when its turn comes)."""
    try:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as image:
            width, height = image.size
            rotated = image.getexif().get(EXIF_ORIENTATION, 1) in (5, 6, 7, 8)
    except UNREADABLE_ERRORS:
        return None
    return (height, width) if rotated else (width, height)


def json_type(value: object) -> str:
    """The JSON name of a parsed value's type ("number", "array", "null", ...), for messages about files."""
    return "null" if value is None else JSON_TYPES.get(type(value), type(value).__name__)


def describe_failure(name: str, error: BaseException) -> str:
    """``"name: reason"``, short enough to list many of them in one log line."""
    if isinstance(error, FileNotFoundError):
        reason = "file not found"
    elif isinstance(error, UnidentifiedImageError):  # its message names a BytesIO object, not the file
        reason = "not an image PIL can read"
    else:
        reason = f"{type(error).__name__}: {error}"
    return f"{name}: {reason[:160]}"


def resize_to_cover(image: Image.Image, height: int, width: int) -> Image.Image:
    """Scale, keeping the aspect ratio, to the smallest size that covers ``height`` x ``width`` (for a square: the
    short side becomes the resolution)."""
    scale = max(width / image.size[0], height / image.size[1])
    new_width, new_height = (max(side, round(original * scale)) for side, original in zip((width, height), image.size))
    return image.resize((new_width, new_height), Image.BICUBIC)


def crop_box(
    image: Image.Image, height: int, width: int, at_random: bool, generator: torch.Generator | None
) -> Image.Image:
    """A ``height`` x ``width`` window: centred, or at a random offset (a cheap augmentation)."""
    extra_x, extra_y = image.size[0] - width, image.size[1] - height
    if at_random:
        left, top = (int(torch.randint(extra + 1, (1,), generator=generator)) for extra in (extra_x, extra_y))
    else:
        left, top = extra_x // 2, extra_y // 2
    return image.crop((left, top, left + width, top + height))


def largest_window(image: Image.Image, height: int, width: int) -> tuple[int, int]:
    """(height, width) of the largest window of the image with the aspect ratio ``height`` : ``width``."""
    scale = min(image.size[0] / width, image.size[1] / height)
    return max(1, min(image.size[1], round(height * scale))), max(1, min(image.size[0], round(width * scale)))


def to_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB image -> (3, H, W) uint8: a quarter of float32's bytes from the worker to the device, where
    ``dit_trainer.pixels.to_model_range`` brings it to the VAE's [-1, 1]."""
    return torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)


def to_model_input(
    image: Image.Image,
    resolution: int | tuple[int, int],
    crop: str = "center",
    horizontal_flip: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Any PIL image -> (3, H, W) uint8 (``to_tensor``): every mode at its full range (``image_modes.to_rgb``: a
    16-bit or float image scaled, not clipped; transparency on white; pixels with no defined scale refused with a
    ``ValueError``, which the sources count as an unreadable image). ``resolution`` is the side of a square or an
    aspect-ratio bucket's (height, width).

    ``crop``: center or random (resized to cover the target, then the target cut out) or none (the whole image
    squashed to the target). ``horizontal_flip`` mirrors half of the images. Random choices draw from
    ``generator``, or from torch's global RNG, which the DataLoader seeds differently in every worker.
    """
    if crop not in CROPS:
        raise ValueError(f"crop must be one of {CROPS}, not {crop!r}")
    height, width = (resolution, resolution) if isinstance(resolution, int) else resolution
    image = to_rgb(image)
    if crop == "none":
        image = image.resize((width, height), Image.BICUBIC)
    else:
        elongation = (image.size[0] * height) / (image.size[1] * width)
        if max(elongation, 1 / elongation) > MAX_ASPECT_RESIZED_WHOLE:  # the target's shape first: bounded memory
            image = crop_box(image, *largest_window(image, height, width), crop == "random", generator)
        image = crop_box(resize_to_cover(image, height, width), height, width, crop == "random", generator)
    pixels = to_tensor(image)
    if horizontal_flip and torch.rand((), generator=generator) < 0.5:
        pixels = pixels.flip(-1)
    return pixels


def caption_keys(caption_column: str, caption_columns: Sequence[str]) -> tuple[str, list[str]]:
    """The config key to name in errors and the caption columns to read: ``caption_columns`` when set."""
    if caption_columns:
        return "data.caption_columns", list(caption_columns)
    return "data.caption_column", [caption_column]


def pick_caption(captions: Sequence[object], generator: torch.Generator | None = None, prefix: str = "") -> str:
    """One of an item's captions (one per configured column), drawn uniformly, with ``prefix`` (``data.caption_prefix``)
    as its first tag. A column holding a list of texts (COCO's five captions per image) offers one of them, drawn
    uniformly too. Anything else (null, a number, a mapping, an empty list) makes the item unreadable: written into
    the prompt as Python's text of it, it would train a caption nobody wrote."""
    caption = _draw(captions, generator)
    if isinstance(caption, (list, tuple)) and caption and all(isinstance(text, str) for text in caption):
        caption = _draw(caption, generator)
    if not isinstance(caption, str):
        shown = repr(caption) if len(repr(caption)) <= 40 else f"{repr(caption)[:40]}..."
        raise ValueError(f"the caption is {shown}, not a text or a list of texts")
    return with_prefix(caption, prefix)


def _draw(choices: Sequence[object], generator: torch.Generator | None) -> object:
    return choices[int(torch.randint(len(choices), (1,), generator=generator)) if len(choices) > 1 else 0]
