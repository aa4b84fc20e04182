"""A folder of video clips with captions (``data=videofolder``): the image folder's conventions, a
``metadata.jsonl`` (``{"file_name": "clip.mp4", "text": ...}`` per line) or, without one, every clip beside a
sidecar ``.txt`` of the same name holding its caption.

Clips are decoded with PyAV (FFmpeg's libraries, bundled in its wheels: no system FFmpeg, no build against the
installed torch as torchcodec's wheels need, every container and codec FFmpeg reads). ``data.frames`` frames are
taken from each clip, resampled to ``data.fps`` when set (every frame at the file's rate otherwise), starting at an
offset drawn from torch's RNG (the DataLoader seeds it per worker from the run's seed); every frame is resized and
cropped alike (one crop offset and one flip per clip). A file that cannot be read (not a video, truncated, no video
stream, fewer frames than a clip needs) is skipped and counted like a bad image (``SkipUnreadable``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np
import torch
from PIL import Image

from dit_trainer.config import DataConfig
from dit_trainer.data.collate import SkipUnreadable
from dit_trainer.data.sources.imagefolder import (
    METADATA,
    ListedFiles,
    metadata_fingerprint,
    open_inside,
    read_metadata,
)
from dit_trainer.data.sources.source import Source, augmentation
from dit_trainer.data.sources.transforms import (
    VIDEO_SUFFIXES,
    UnfitFile,
    caption_keys,
    pick_caption,
    to_model_input,
)
from dit_trainer.errors import ConfigError


def sidecar_records(folder: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(file, (caption,)) of every clip in ``folder`` (recursively) that has a sidecar ``.txt``, sorted."""
    clips = sorted(p for p in folder.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES and not p.name.startswith("."))
    return [
        (str(clip.relative_to(folder)), (clip.with_suffix(".txt").read_text(encoding="utf-8").strip(),))
        for clip in clips
        if clip.with_suffix(".txt").is_file()
    ]


def check_video_folder(path: str, key: str = "data.path") -> None:
    """``key`` holds a metadata.jsonl, or clips with sidecar captions: checked with the config, before any model is
    built."""
    folder = Path(path).expanduser()
    if (folder / METADATA).is_file() or (folder.is_dir() and sidecar_records(folder)):
        return
    raise ConfigError(
        key,
        str(folder),
        "no metadata.jsonl was found there (one JSON object per clip with `file_name` and a caption column), nor "
        f"clips ({', '.join(VIDEO_SUFFIXES)}) with a caption in a .txt file of the same name",
        f"point `{key}` at the folder that holds the clips and their captions",
    )


def clip_size(file) -> tuple[int, int]:
    """(width, height) of the video in ``file`` as decoded, from its container's header (no frame decoded)."""
    try:
        with av.open(file) as container:
            if not container.streams.video:
                raise ValueError("it has no video stream (audio only?)")
            context = container.streams.video[0].codec_context
            if not (context.width and context.height):
                raise ValueError("its header gives no frame size")
            return context.width, context.height
    except av.FFmpegError as error:  # a subclass of neither OSError nor ValueError
        raise ValueError(f"FFmpeg cannot read it: {error}") from error


def decode_clip(file, frames: int, fps: float | None, generator: torch.Generator | None = None) -> list[np.ndarray]:
    """``frames`` RGB frames (H, W, 3) of the video in ``file``: consecutive at the file's rate, or at ``fps`` (frames
    repeated or skipped), from an offset drawn from ``generator`` (torch's RNG by default). Anything that makes it no
    clip of that length is a ``ValueError`` (the sources' unreadable-file errors)."""
    try:
        with av.open(file) as container:
            if not container.streams.video:
                raise ValueError("it has no video stream (audio only?)")
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0) or None
            step = rate / fps if fps and rate else 1.0  # source frames per clip frame
            span = math.floor((frames - 1) * step) + 1  # source frames a clip covers
            count = stream.frames  # 0 where the container does not say
            if count and count < span:
                raise UnfitFile(
                    f"it has {count} frames, fewer than the {span} a clip of {frames} needs",
                    "data.frames",
                    frames,
                    f"lower `data.frames` to fit the clips (or set `data.fps` nearer their own rate, {rate:g} fps, "
                    "to spread a clip over fewer of their frames)" if rate else "lower `data.frames` to fit the clips",
                )  # fmt: skip
            start = int(torch.randint(count - span + 1, (), generator=generator)) if count else 0
            wanted = [start + math.floor(k * step) for k in range(frames)]
            picked: list[np.ndarray] = []
            for index, frame in enumerate(container.decode(stream)):
                while len(picked) < frames and wanted[len(picked)] == index:
                    picked.append(frame.to_ndarray(format="rgb24"))
                if len(picked) == frames:
                    return picked
    except av.FFmpegError as error:  # a subclass of neither OSError nor ValueError
        raise ValueError(f"FFmpeg cannot decode it: {error}") from error
    raise ValueError(f"it decodes to fewer frames than the {span} a clip of {frames} needs (truncated?)")


def prepare_clip(
    frames: list[np.ndarray],
    size: int | tuple[int, int],
    crop: str,
    flip: bool,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(3, F, H, W) model input of a clip's frames (one frame: (3, H, W)), every frame resized and cropped alike: one
    crop offset and one flip drawn for the clip from ``generator`` (torch's RNG by default)."""
    seed = int(torch.randint(2**62, (), generator=generator))
    prepared = [
        to_model_input(Image.fromarray(frame), size, crop, flip, torch.Generator().manual_seed(seed))
        for frame in frames
    ]
    return torch.stack(prepared, dim=1) if len(prepared) > 1 else prepared[0]


class VideoFolderDataset(ListedFiles, SkipUnreadable):
    """Clips listed in ``root/metadata.jsonl`` or beside sidecar captions (see the module); items are
    ``{"image": (3, F, H, W) uint8, "caption": str}`` (one frame: (3, H, W)). ``width`` and ``height`` on every
    metadata line spare buckets reading each clip's header (``clip_size``)."""

    source_name, kind, read_size = "videofolder", "clips", staticmethod(clip_size)

    def __init__(
        self,
        root: str | Path,
        resolution: int,
        frames: int,
        fps: float | None = None,
        caption_column: str = "text",
        crop: str = "center",
        horizontal_flip: bool = False,
        caption_columns: Sequence[str] = (),
        caption_prefix: str = "",
    ) -> None:
        self.root = Path(root).expanduser()
        self.real_root, self.path = self.root.resolve(), str(self.root)
        self.resolution, self.crop, self.horizontal_flip = resolution, crop, horizontal_flip
        self.frames, self.fps, self.caption_prefix = frames, fps, caption_prefix
        metadata = self.root / METADATA
        if metadata.is_file():
            self.records, self.sizes = read_metadata(metadata, *caption_keys(caption_column, caption_columns))
            self.keep_all_or_no_sizes()
        else:
            self.records = sidecar_records(self.root)
            self.sizes = [None] * len(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def name(self, index: int) -> str:
        return self.records[index][0]

    def read(self, index: int) -> tuple[list[np.ndarray], str]:
        file_name, captions = self.records[index]
        with open_inside(self.real_root, file_name) as file:
            frames = decode_clip(file, self.frames, self.fps)
        return frames, pick_caption(captions, prefix=self.caption_prefix)

    def prepare(self, frames: list[np.ndarray], size: int | tuple[int, int]) -> torch.Tensor:
        return prepare_clip(frames, size, self.crop, self.horizontal_flip)


def _build(cfg: DataConfig) -> VideoFolderDataset:
    return VideoFolderDataset(cfg.path, cfg.resolution, cfg.frames, cfg.fps, cfg.caption_column, **augmentation(cfg))


def _content(cfg: DataConfig) -> dict:
    """metadata.jsonl's fingerprint, or the sidecar captions': their number and a hash of (file, caption)."""
    folder = Path(cfg.path).expanduser()
    if (folder / METADATA).is_file():
        return metadata_fingerprint(cfg.path)
    records = sidecar_records(folder)
    return {"entries": len(records), "sidecars_sha256": hashlib.sha256(json.dumps(records).encode()).hexdigest()}


def write_mp4(frames: np.ndarray, target: Path | BinaryIO, fps: float) -> None:
    """(F, H, W, 3) uint8 frames as an H.264 MP4 (yuv420p: what browsers and players read; even sides needed) into
    the file ``target`` names or is (opened for binary writing)."""
    with av.open(str(target) if isinstance(target, Path) else target, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=round(fps))
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "18"}
        for pixels in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")))
        container.mux(stream.encode())


SOURCE = Source(
    _build,
    "the folder that holds your clips and their captions (metadata.jsonl, or a .txt beside each clip)",
    "/path/to/clips",
    check_video_folder,
    bucketed=True,
    caption_prefix=True,
    random_reads=lambda cfg: True,  # a clip's start, whatever the augmentation
    content=_content,
    clips=True,
)
