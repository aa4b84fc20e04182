"""What the model sees (``scripts/preview_data.py``): items of a run's training data as the trainer's data pipeline
delivers them (source, held-out split, aspect-ratio buckets, decode, crop and resize, the caption the item carries),
written as PNGs with ``index.jsonl`` and a contact sheet, without building the VAE, the text encoder or the DiT.

The data are built by ``data.loading.build_source``, the function a run calls, with the run's checks (a data set
smaller than one batch, buckets that fill no batch) and its bucket report. From a random-access source the preview
reads ``n`` items drawn with the run's seed (every bucket in proportion, not only the first batches' buckets); from
a stream, the first ``n`` items of the training loader. Caption dropout happens in the training step, not in the
data: captions are shown before it. A run that trains from a latent cache (``data.cache_dir``) is shown from the
source images the cache was encoded from.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, replace
from itertools import islice
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset

from dit_trainer.apps.inference import new_file, refuse_overwrite
from dit_trainer.components.geometry import configured_buckets
from dit_trainer.config import DataConfig, ModelConfig, PreviewConfig, TrainerConfig, VAEConfig, ValidationConfig
from dit_trainer.data.buckets import BucketTable
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.loading import build_dataloader, build_source, loader_options
from dit_trainer.data.mixture import item_sources
from dit_trainer.data.sources.transforms import to_tensor
from dit_trainer.errors import ConfigError, shortlist
from dit_trainer.images import image_grid

INDEX = "index.jsonl"
CONTACT_SHEET = "contact_sheet.png"
TILE = 128  # the contact sheet's cell: each image scaled to fit, keeping its aspect ratio
MARGIN = 3  # white pixels around each image in its cell
COLUMNS = 8


@dataclass
class PreviewResult:
    out_dir: Path
    items: int
    buckets: dict[str, int]  # "HxW" -> items
    bad_files: list[str]  # unreadable files the source skipped on the way
    held_out: int  # items validation keeps out of training (not shown)

    @property
    def message(self) -> str:
        sizes = ", ".join(f"{size}: {count}" for size, count in self.buckets.items())
        notes = []
        if self.held_out:
            notes.append(f"not shown: {self.held_out} item{'s' * (self.held_out != 1)} held out for validation")
        if self.bad_files:
            notes.append(f"{len(self.bad_files)} unreadable files skipped: {shortlist(self.bad_files, 5)}")
        return (
            f"Wrote {self.items} images as the model sees them (height x width: images: {sizes}) to {self.out_dir}, "
            f"with {INDEX} (file, caption, bucket) and {CONTACT_SHEET}" + "".join(f"; {note}" for note in notes) + "."
        )


def preview_items(
    data: DataConfig, validation: ValidationConfig, trainer: TrainerConfig, buckets: BucketTable | None, n: int
) -> tuple[list[dict], int]:
    """Up to ``n`` items of the training data, each ``{"image": (3, H, W) uint8 (a clip's frames side by side),
    "bucket": "HxW", "caption", "bad_files"}``, and the number of items the held-out split keeps from training.
    ``buckets``: the run's table (``configured_buckets``)."""
    data = replace(data, cache_dir=None, cache_latents=False)  # images, not latents
    set_seed(trainer.seed)
    accelerator = Accelerator(cpu=True)  # no sizes index is written
    dataset, held_out = build_source(data, validation, trainer.batch_size, trainer.seed, buckets, None, accelerator)
    held = len(held_out) if held_out is not None and validation.split and not validation.path else 0
    device = torch.device("cpu")
    if isinstance(dataset, IterableDataset) or item_sources(dataset) is not None:
        # a stream, or a mixture (whose epochs draw each source by its weight): the training loader's first items
        batches = build_dataloader(data, trainer, dataset, device)
    else:
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(trainer.seed))
        options = loader_options(data, dataset, device)
        batches = DataLoader(
            dataset,
            batch_size=1,
            sampler=sorted(order[:n].tolist()),
            collate_fn=collate_batch,
            num_workers=options["num_workers"],
            prefetch_factor=options["prefetch_factor"],
        )
    return list(islice(_items(batches), n)), held


def as_pixels(image: torch.Tensor) -> torch.Tensor:
    """An item's image as (3, H, W) uint8, a clip (3, F, H, W) as its frames side by side (3, H, F x W): the
    sources' own pixels, or a procedural source's float in [-1, 1] (what ``pixels.to_model_range`` passes to the
    model) brought back to them."""
    if image.dim() == 4:
        channels, frames, height, width = image.shape
        image = image.permute(0, 2, 1, 3).reshape(channels, height, frames * width)
    if image.dtype == torch.uint8:
        return image
    return ((image.float() + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)


def _items(batches: Iterable[dict]) -> Iterator[dict]:
    """The items of collated ``batches``, each with its ``bucket`` (a frame's "HxW"); a batch's skipped files ride
    on its first item."""
    for batch in batches:
        bad = batch["bad_files"]
        for image, caption in zip(batch["image"], batch["caption"]):
            bucket = "x".join(map(str, image.shape[-2:]))
            yield {"image": as_pixels(image), "bucket": bucket, "caption": caption, "bad_files": bad}
            bad = []


def contact_sheet(images: list[torch.Tensor], labels: list[str]) -> Image.Image:
    """The images side by side in ``TILE`` cells, each scaled to fit with a margin (nearest when enlarged, so
    pixels stay visible) on white, keeping its aspect ratio, labelled under its cell."""
    tiles = torch.ones(len(images), 3, TILE, TILE)
    for tile, image in zip(tiles, images):
        height, width = image.shape[1:]
        scale = (TILE - 2 * MARGIN) / max(height, width)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        picture = Image.fromarray(image.permute(1, 2, 0).numpy())
        picture = picture.resize(size, Image.NEAREST if scale >= 1 else Image.LANCZOS)
        top, left = (TILE - size[1]) // 2, (TILE - size[0]) // 2
        tile[:, top : top + size[1], left : left + size[0]] = to_tensor(picture) / 255
    return image_grid(tiles, min(COLUMNS, len(images)), labels=labels)


def preview_data(
    model: ModelConfig,
    vae: VAEConfig,
    data: DataConfig,
    validation: ValidationConfig,
    trainer: TrainerConfig,
    args: PreviewConfig,
) -> PreviewResult:
    """Write ``args.n`` items of the run's training data to ``args.out_dir``: ``00000.png``... at the size the
    model sees (the buckets ``model`` and ``vae`` allow), ``index.jsonl`` (``{"file", "caption", "bucket"}``, bucket
    as "HxW") and the contact sheet."""
    if args.out_dir is None:
        raise ConfigError(
            "out_dir", None, "the preview needs a folder to write the images into", "add e.g. `out_dir=preview/my_data`"
        )
    out_dir = Path(args.out_dir).expanduser()
    refuse_overwrite(out_dir, [INDEX, CONTACT_SHEET, *(f"{index:05d}.png" for index in range(args.n))], "preview")
    items, held_out = preview_items(data, validation, trainer, configured_buckets(model, vae, data), args.n)
    out_dir.mkdir(parents=True, exist_ok=True)
    records, buckets = [], {}
    for index, item in enumerate(items):
        image, bucket = item["image"], item["bucket"]
        name = f"{index:05d}.png"
        with new_file(out_dir / name, command="preview") as file:
            Image.fromarray(image.permute(1, 2, 0).numpy()).save(file, format="PNG")
        records.append({"file": name, "caption": item["caption"], "bucket": bucket})
        buckets[bucket] = buckets.get(bucket, 0) + 1
    lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    with new_file(out_dir / INDEX, binary=False, command="preview") as file:
        file.write(lines)
    labels = [f"{index}: {record['bucket']}" for index, record in enumerate(records)]
    with new_file(out_dir / CONTACT_SHEET, command="preview") as file:
        contact_sheet([item["image"] for item in items], labels).save(file, format="PNG")
    bad = [name for item in items for name in item["bad_files"]]
    return PreviewResult(out_dir, len(items), dict(sorted(buckets.items())), bad, held_out)


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the preview's own ``key=value`` items: ``PreviewConfig``'s fields, which train.py has no key of, and keys
    mistyped from them, which its parsing then names; train.py's overrides, whose keys have a section)."""
    names = [field.name for field in fields(PreviewConfig)]

    def own(item: str) -> bool:
        key = item.partition("=")[0]
        return key in names or ("." not in key and bool(difflib.get_close_matches(key, names, cutoff=0.75)))

    return [item for item in argv if own(item)], [item for item in argv if not own(item)]
