"""Image and caption preparation shared by the file-based data sources (imagefolder, hf, webdataset)."""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

# center / random: the short side resized to the resolution, then a square cut out; none: squashed to a square.
CROPS = ("center", "random", "none")
# Resizing an image whole costs memory in proportion to its elongation (a 10 x 20000 strip at 1024 px: 8 GB). Up to
# this aspect ratio it is done as always (so the images of every earlier run come out bit-identical); beyond it, the
# square is cut out of the original first.
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


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB with any transparency composited on white (a transparent pixel's hidden colour is often black)."""
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return image.convert("RGB")


def resize_short_side(image: Image.Image, resolution: int) -> Image.Image:
    """Scale so the short side is ``resolution``, keeping the aspect ratio (the long side never drops below it)."""
    scale = resolution / min(image.size)
    width, height = (max(resolution, round(side * scale)) for side in image.size)
    return image.resize((width, height), Image.BICUBIC)


def crop_square(image: Image.Image, resolution: int, at_random: bool, generator: torch.Generator | None) -> Image.Image:
    """A ``resolution`` square: centred, or at a random offset along the long side (a cheap augmentation)."""
    extra_x, extra_y = image.size[0] - resolution, image.size[1] - resolution
    if at_random:
        left, top = (int(torch.randint(extra + 1, (1,), generator=generator)) for extra in (extra_x, extra_y))
    else:
        left, top = extra_x // 2, extra_y // 2
    return image.crop((left, top, left + resolution, top + resolution))


def to_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB image -> (3, H, W) float in [-1, 1], the range the VAE expects."""
    pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)
    return pixels.float() / 127.5 - 1.0


def to_model_input(
    image: Image.Image,
    resolution: int,
    crop: str = "center",
    horizontal_flip: bool = False,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Any PIL image -> (3, resolution, resolution) float in [-1, 1].

    ``crop``: center or random (short side resized to ``resolution``, then a square cut out) or none (the whole
    image squashed to a square). ``horizontal_flip`` mirrors half of the images. Random choices draw from
    ``generator``, or from torch's global RNG, which the DataLoader seeds differently in every worker.
    """
    if crop not in CROPS:
        raise ValueError(f"crop must be one of {CROPS}, not {crop!r}")
    image = to_rgb(image)
    if crop == "none":
        image = image.resize((resolution, resolution), Image.BICUBIC)
    else:
        if max(image.size) > MAX_ASPECT_RESIZED_WHOLE * min(image.size):  # the square first: memory stays bounded
            image = crop_square(image, min(image.size), crop == "random", generator)
        image = crop_square(resize_short_side(image, resolution), resolution, crop == "random", generator)
    pixels = to_tensor(image)
    if horizontal_flip and torch.rand((), generator=generator) < 0.5:
        pixels = pixels.flip(-1)
    return pixels


def caption_keys(caption_column: str, caption_columns: Sequence[str]) -> tuple[str, list[str]]:
    """The config key to name in errors and the caption columns to read: ``caption_columns`` when set."""
    if caption_columns:
        return "data.caption_columns", list(caption_columns)
    return "data.caption_column", [caption_column]


def pick_caption(captions: Sequence[object], generator: torch.Generator | None = None) -> str:
    """One of an item's captions (one per configured column), drawn uniformly; a null caption is unreadable."""
    index = int(torch.randint(len(captions), (1,), generator=generator)) if len(captions) > 1 else 0
    if captions[index] is None:
        raise ValueError("the caption is null")
    return str(captions[index])
