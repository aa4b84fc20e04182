"""The embedded ``shapes`` data set: one filled shape on a grey background, captioned ``"a {color} {shape}"``.

It is procedural and deterministic per index, so it needs no download, and ``score_alignment`` can judge a
generated image from its pixels alone, which makes it a real (if small) text-to-image benchmark on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from dit_trainer.data.sources.source import Source

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 170, 40),
    "blue": (30, 60, 230),
    "yellow": (240, 220, 30),
    "purple": (140, 40, 170),
    "orange": (250, 140, 20),
    "white": (250, 250, 250),
    "black": (15, 15, 15),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
BACKGROUND: tuple[int, int, int] = (128, 128, 128)
CAPTIONS: tuple[str, ...] = tuple(f"a {color} {shape}" for shape in SHAPES for color in COLORS)


def shape_mask(shape: str, height: int, width: int) -> np.ndarray:
    """Boolean mask of ``shape`` filling a ``height`` x ``width`` box (triangles point up)."""
    ys = (np.arange(height) + 0.5)[:, None] / height
    xs = (np.arange(width) + 0.5)[None, :] / width
    if shape == "square":
        return np.ones((height, width), dtype=bool)
    if shape == "circle":
        return (ys - 0.5) ** 2 + (xs - 0.5) ** 2 <= 0.25
    if shape == "triangle":
        return np.abs(xs - 0.5) <= ys / 2
    raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")


def render(color: str, shape: str, size: int, top: int, left: int, height: int, width: int | None = None) -> np.ndarray:
    """A ``height`` x ``width`` (default square) RGB uint8 image with one ``size``-pixel ``shape`` whose box starts
    at (top, left)."""
    image = np.empty((height, width or height, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    box = image[top : top + size, left : left + size]
    box[shape_mask(shape, size, size)] = COLORS[color]
    return image


def shape_spec(index: int, seed: int, height: int, width: int) -> tuple[str, str, int, int, int]:
    """(color, shape, size, top, left) of image ``index`` on a ``height`` x ``width`` canvas: colour and shape
    cycle with the index, so every caption is equally frequent; size and position are drawn from (seed, index)."""
    color = list(COLORS)[index % len(COLORS)]
    shape = SHAPES[(index // len(COLORS)) % len(SHAPES)]
    rng = np.random.default_rng((seed, index))
    side = min(height, width)
    size = int(rng.integers(side * 5 // 16, side * 11 // 16 + 1))
    top, left = (int(v) for v in rng.integers(0, [height - size + 1, width - size + 1]))
    return color, shape, size, top, left


class ShapesDataset(Dataset):
    """``length`` shapes images at ``resolution``; item ``i`` is the same for a given ``seed``.

    Colour and shape cycle with the index; size and position are random (``shape_spec``).
    Items are ``{"image": (3, H, W) float in [-1, 1], "caption": str}`` like every data source here.
    """

    def __init__(self, length: int = 20_000, resolution: int = 32, seed: int = 0) -> None:
        self.length = length
        self.resolution = resolution
        self.seed = seed

    def __len__(self) -> int:
        return self.length

    def spec(self, index: int) -> tuple[str, str, int, int, int]:
        """(color, shape, size, top, left) of item ``index``."""
        return shape_spec(index, self.seed, self.resolution, self.resolution)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | str]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        color, shape, size, top, left = self.spec(index)
        pixels = render(color, shape, size, top, left, self.resolution)
        image = torch.from_numpy(pixels).permute(2, 0, 1).float() / 127.5 - 1.0
        return {"image": image, "caption": f"a {color} {shape}"}


def _read_one(pixels: np.ndarray) -> tuple[str | None, dict[str, float]]:
    """The colour seen in one (H, W, 3) image with values in [0, 255] (``None``: nothing seen), and the IoU of the
    shape's bounding-box mask with each shape's template (empty: no shape)."""
    background = np.asarray(BACKGROUND, dtype=np.float32)
    foreground = np.abs(pixels - background).max(axis=-1) > 48
    if foreground.sum() < 4:
        return None, {}
    palette = np.asarray(list(COLORS.values()), dtype=np.float32)
    median = np.median(pixels[foreground], axis=0)
    color_index = int(np.argmin(((palette - median) ** 2).sum(axis=1)))
    # Pixels nearer to the found colour than to the background form the shape (robust to soft edges).
    to_color = ((pixels - palette[color_index]) ** 2).sum(axis=-1)
    to_background = ((pixels - background) ** 2).sum(axis=-1)
    mask = to_color < to_background
    # Drop speckle: keep pixels with at least two of their four neighbours in the mask.
    padded = np.pad(mask, 1)
    neighbours = padded[:-2, 1:-1].astype(int) + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]
    mask &= neighbours >= 2
    rows, cols = np.nonzero(mask)
    if len(rows) < 4:
        return list(COLORS)[color_index], {}
    box = mask[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    ious = {}
    for shape in SHAPES:
        template = shape_mask(shape, *box.shape)
        ious[shape] = float((box & template).sum() / (box | template).sum())
    return list(COLORS)[color_index], ious


def _read(images: torch.Tensor) -> list[tuple[str | None, dict[str, float]]]:
    """``_read_one`` of each image of a (B, 3, H, W) batch in [0, 1]."""
    pixels = (images.detach().float().clamp(0, 1) * 255).permute(0, 2, 3, 1).cpu().numpy()
    return [_read_one(image) for image in pixels]


def classify(images: torch.Tensor) -> list[tuple[str | None, str | None]]:
    """(colour, shape) read from each image of a (B, 3, H, W) batch in [0, 1]; ``None`` where nothing is seen.
    The shape is the template that overlaps the shape's mask best."""
    return [(color, max(ious, key=ious.get) if ious else None) for color, ious in _read(images)]


def is_shapes_caption(caption: str) -> bool:
    """Whether ``caption`` is ``"a {color} {shape}"`` of the judge's colours and shapes: what it can score."""
    words = caption.split(" ")
    return len(words) == 3 and words[0] == "a" and words[1] in COLORS and words[2] in SHAPES


def _captioned(captions: list[str]) -> list[tuple[str, str]]:
    """(colour, shape) asked for by each ``"a {color} {shape}"`` caption."""
    return [tuple(caption.removeprefix("a ").split(" ", 1)) for caption in captions]


def shape_margins(images: torch.Tensor, captions: list[str]) -> torch.Tensor:
    """(B,) how clearly each image shows its captioned shape: the template IoU of that shape minus the best other
    shape's, in [-1, 1] (positive only when the judge reads the captioned shape; -1 when no shape is seen).
    Unlike the judge's verdict it keeps rising as a shape becomes cleaner, so it separates images the verdict ties."""
    margins = []
    for (_, ious), (_, shape) in zip(_read(images), _captioned(captions)):
        others = [iou for name, iou in ious.items() if name != shape]
        margins.append(ious[shape] - max(others) if ious else -1.0)
    return torch.tensor(margins, dtype=torch.float32)


def alignment_components(images: torch.Tensor, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image: (colour correct, shape correct) as float tensors of shape (B,)."""
    seen = classify(images)
    expected = _captioned(captions)
    color_ok = torch.tensor([s[0] == e[0] for s, e in zip(seen, expected)], dtype=torch.float32)
    shape_ok = torch.tensor([s[1] == e[-1] for s, e in zip(seen, expected)], dtype=torch.float32)
    return color_ok, shape_ok


def score_alignment(images: torch.Tensor, captions: list[str]) -> torch.Tensor:
    """(B,) scores in [0, 1]: half for the captioned colour, half for the captioned shape, judged from pixels."""
    color_ok, shape_ok = alignment_components(images, captions)
    return (color_ok + shape_ok) / 2


def write_shapes_folder(folder: Path, count: int, sizes: list[tuple[int, int]], seed: int = 0) -> Path:
    """An imagefolder (PNGs and metadata.jsonl) of ``count`` shapes on canvases of the (height, width) ``sizes``
    in turn: real mixed-aspect data to try ``data.buckets`` on a CPU."""
    folder.mkdir(parents=True, exist_ok=False)
    rows = []
    for index in range(count):
        height, width = sizes[index % len(sizes)]
        color, shape, size, top, left = shape_spec(index, seed, height, width)
        name = f"{index:05d}.png"
        Image.fromarray(render(color, shape, size, top, left, height, width)).save(folder / name)
        rows.append(json.dumps({"file_name": name, "text": f"a {color} {shape}"}) + "\n")
    (folder / "metadata.jsonl").write_text("".join(rows))
    return folder


def judge(images: torch.Tensor, captions: list[str]) -> dict[str, float]:
    """Share of images showing the captioned colour, and the captioned shape."""
    color_ok, shape_ok = alignment_components(images, captions)
    return {"color": color_ok.mean().item(), "shape": shape_ok.mean().item()}


SOURCE = Source(
    lambda cfg: ShapesDataset(length=cfg.length, resolution=cfg.resolution, seed=cfg.seed),
    captions=lambda: list(CAPTIONS),
    judge=judge,
)
