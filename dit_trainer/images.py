"""Image tensors to PIL: single images and labelled grids (of clips: one grid per frame, an animation), for sample
folders, monitors and reports; and which files of a folder are images, and which of its sub-folders are classes of
images."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import BinaryIO

import torch
from PIL import Image, ImageDraw, ImageFont

IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")  # the files of a class folder that are its images
LABEL_HEIGHT = 12  # a line of PIL's default font
ANIMATION_FPS = 8.0  # frames per second of the monitors' animated grids of clips
CHAR_WIDTH = 6


def image_names(folder: Path) -> list[str]:
    """The images in ``folder`` and in its sub-folders (where torchvision's ``ImageFolder`` finds a class's images),
    as paths relative to it, sorted: visible files with an image suffix in visible folders (not the ``._x.png``
    metadata files that macOS copies leave beside each image, nor the copies in ``.ipynb_checkpoints``)."""
    names = []
    for root, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]
        inside = Path(root).relative_to(folder)
        names += [(inside / name).as_posix() for name in files if is_image_name(name)]
    return sorted(names)


def is_image_name(name: str) -> bool:
    """A visible file with an image suffix."""
    return not name.startswith(".") and Path(name).suffix.lower().lstrip(".") in IMAGE_SUFFIXES


def class_folders(path: str | Path) -> list[str]:
    """The classes of a torchvision-style ``ImageFolder`` at ``path``: its sub-folders that hold images, sorted. A
    hidden folder (``.ipynb_checkpoints``, ``.git``) or an empty one is no class a person would name: counted as
    one, it would take a class id and a row of the label table that no image ever trains."""
    folder = Path(path).expanduser()
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if entry.is_dir() and not entry.name.startswith(".") and image_names(entry)
    )


def to_pil(image: torch.Tensor) -> Image.Image:
    """(3, H, W) in [0, 1] -> an RGB PIL image."""
    pixels = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(pixels)


def drawable(text: str, font: ImageFont.ImageFont | ImageFont.FreeTypeFont) -> str:
    """``text`` as ``font`` can draw it. PIL's default font is a FreeType one (glyphs it lacks draw as boxes), but
    a Pillow built without FreeType falls back to a latin-1 bitmap font that raises on any other character: an emoji
    in a prompt must not end a run at its first sample grid."""
    if isinstance(font, ImageFont.FreeTypeFont):
        return text
    return text.encode("latin-1", errors="replace").decode("latin-1")


def image_grid(
    images: torch.Tensor,
    columns: int,
    labels: list[str] | None = None,
    row_labels: list[str] | None = None,
    min_tile: int = 64,
) -> Image.Image:
    """(N, 3, H, W) in [0, 1] -> one grid: ``labels`` (one per image) under the tiles, ``row_labels`` (one per row,
    e.g. the prompt) in a left margin. Tiny images are upscaled (nearest) so they stay visible."""
    count, _, height, width = images.shape
    scale = max(1, math.ceil(min_tile / max(height, width)))
    tile_width, tile_height = width * scale, height * scale
    cell_height = tile_height + (LABEL_HEIGHT if labels else 0)
    margin = CHAR_WIDTH * max(map(len, row_labels)) + 8 if row_labels else 0
    rows = math.ceil(count / columns)
    grid = Image.new("RGB", (margin + columns * tile_width, rows * cell_height), "white")
    draw, font = ImageDraw.Draw(grid), ImageFont.load_default()
    for row, text in enumerate(row_labels or []):
        position = (4, row * cell_height + tile_height // 2 - LABEL_HEIGHT // 2)
        draw.text(position, drawable(text, font), fill="black", font=font)
    for index, image in enumerate(images):
        left, top = margin + (index % columns) * tile_width, (index // columns) * cell_height
        grid.paste(to_pil(image).resize((tile_width, tile_height), Image.NEAREST), (left, top))
        if labels:
            draw.text((left + 2, top + tile_height), drawable(labels[index], font), fill="black", font=font)
    return grid


def clip_grids(clips: torch.Tensor, columns: int, **labels) -> list[Image.Image]:
    """(N, 3, F, H, W) clips in [0, 1] -> F grids (``image_grid``'s, with its ``labels``/``row_labels``), frame by
    frame: the frames of one animated grid."""
    return [image_grid(clips[:, :, frame], columns, **labels) for frame in range(clips.shape[2])]


def save_animation(frames: list[Image.Image], target: Path | BinaryIO, fps: float) -> None:
    """``frames`` as a looping animated GIF at ``fps`` into the file ``target`` names or is: PIL writes it, so a clip
    needs no video codec to be seen in a browser, W&B (``wandb.Video``) or a file viewer."""
    duration = round(1000 / fps)
    frames[0].save(target, format="GIF", save_all=True, append_images=frames[1:], duration=duration, loop=0)
