"""Write the cache (see ``dit_trainer.data.cache.cache``): encode the data set once with the frozen VAE and text
encoder.

Run as ``python scripts/precompute.py <train.py overrides>``, or under ``accelerate launch`` to split the data set
across processes: each rank encodes every N-th item (a webdataset splits by shard) and writes its own shards; rank 0
writes ``index.json`` when all are done.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import parse_flag_from_env
from safetensors.torch import save_file
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset
from tqdm.auto import tqdm

from dit_trainer.components.conditioners.text_encoder import build_text_encoder
from dit_trainer.components.geometry import check_resolution, configured_buckets
from dit_trainer.components.vae import build_vae
from dit_trainer.config import (
    ConditionerConfig,
    DataConfig,
    ModelConfig,
    MonitorConfig,
    TrainerConfig,
    VAEConfig,
)
from dit_trainer.data.bad_files import PassBadFiles
from dit_trainer.data.buckets import BucketTable, bucketed, in_order_loader
from dit_trainer.data.cache.cache import (
    IMAGE_SIZES,
    INDEX,
    PROMPTS,
    SHARD_LIST,
    TENSOR_KEYS,
    check_cache_folder,
    read_index,
    save_shard,
    shard_name,
)
from dit_trainer.data.cache.fingerprint import cache_fingerprint, check_fingerprint
from dit_trainer.data.loading import drawn_per_item, loader_workers
from dit_trainer.data.sources.source import build_dataset
from dit_trainer.durable import write_atomically, write_text_atomically
from dit_trainer.errors import ConfigError, shortlist
from dit_trainer.pixels import to_model_range
from dit_trainer.precision import resolve_mixed_precision, weight_dtype
from dit_trainer.prompts import reward_monitor_prompts, sampled_prompts


@dataclass
class PrecomputeResult:
    cache_dir: Path
    items: int  # encoded now (0 when the cache existed and only prompts were added)
    bad_files: list[str]  # each unreadable file once (a file is tried again as the next item's replacement)

    @property
    def message(self) -> str:
        """What ``scripts/precompute.py`` prints. A complete cache names the unreadable files it was encoded
        without: a file fixed since is not encoded again (the data's fingerprint is its list of files, not their
        bytes), and its row stays a copy of another image."""
        skipped = f"{len(self.bad_files)} unreadable files skipped" if self.bad_files else ""
        if self.items:
            return f"Cache {self.cache_dir}: encoded {self.items} items" + (f", {skipped}." if skipped else ".")
        kept = (
            f" It was encoded with {skipped} (first: {shortlist(self.bad_files, 3, '; ')}), their rows copies of other "
            "images: to encode files fixed since, precompute into a new `data.cache_dir`."
            if skipped
            else ""
        )
        return f"Cache {self.cache_dir}: already complete; prompts updated.{kept}"


def _refuse_random_augmentation(data: DataConfig) -> None:
    drawn = (
        ("data.crop", data.crop == "random"),
        ("data.horizontal_flip", data.horizontal_flip),
        ("data.caption_columns", bool(data.caption_columns)),
    )
    for key, frozen in drawn:
        if frozen:
            raise ConfigError(
                key,
                getattr(data, key.split(".")[1]),
                "a cache stores one encoding per image, so a random choice (crop, flip, caption) would be drawn "
                "once and frozen",
                "cache with `data.crop=center data.horizontal_flip=false` and one `data.caption_column` (with "
                "`data.caption_columns=[]`), or train without `data.cache_dir`",
            )


def _cache_dir(data: DataConfig) -> Path:
    if not data.cache_dir:
        raise ConfigError(
            "data.cache_dir", None, "precompute needs a folder to write the cache into", "add `data.cache_dir=DIR`"
        )
    return Path(data.cache_dir).expanduser()


def _rank_share(dataset, state: PartialState):
    """This rank's part of the data set: every N-th item (an iterable data set splits itself by rank)."""
    if isinstance(dataset, IterableDataset) or state.num_processes == 1:
        return dataset
    return Subset(dataset, range(state.process_index, len(dataset), state.num_processes))


def _source_items(share: Dataset, loader: DataLoader) -> Iterator[list[int]] | None:
    """The source item each row of each batch of ``loader`` holds, in reading order (a rank's share is every N-th
    item, buckets are read bucket by bucket): what lets a held-out split find its items' rows. None for a stream,
    which has no item numbers (and which no split holds items out of)."""
    if isinstance(share, IterableDataset):
        return None
    to_source = share.indices if isinstance(share, Subset) else range(len(share))
    return iter([[to_source[row] for row in rows] for rows in loader.batch_sampler])


@torch.no_grad()
def _encode_images(
    data: DataConfig,
    trainer: TrainerConfig,
    table: BucketTable | None,
    cache_dir: Path,
    state: PartialState,
    vae,
    text_encoder,
) -> tuple[int, list]:
    """Encode this rank's share into shards; returns (items, bad files) and leaves its shard list beside them. Too
    many unreadable files (``data.max_bad_fraction``) stop it: each one's row would hold a copy of another image.
    What a source draws at random when read (a clip's start) is drawn as a run's first epoch draws it."""
    device, batch_size = state.device, trainer.batch_size
    sizes_dir = cache_dir / IMAGE_SIZES  # a precompute run again (one that did not finish) reads no header
    source = bucketed(build_dataset(data), table, batch_size, False, state.is_main_process, sizes_dir)
    source = drawn_per_item(data, source, trainer.seed)
    share = _rank_share(source, state)
    loader = in_order_loader(share, batch_size, loader_workers(data.num_workers, share))  # bucket by bucket
    source_items = _source_items(share, loader)
    storage, shards, items = getattr(torch, data.cache_dtype), [], 0
    bad_files = PassBadFiles.over(data, share)
    pending: dict[tuple[int, int], list[dict]] = {}  # encoded batches by image size: every shard holds one size

    def flush(size: tuple[int, int]) -> None:
        batches = pending.pop(size)
        tensors = {k: torch.cat([batch[k] for batch in batches]) for k in TENSOR_KEYS if k in batches[0]}
        captions = [c for batch in batches for c in batch["caption"]]
        indices = None if source_items is None else [i for batch in batches for i in batch["items"]]
        name = shard_name(state.process_index, len(shards))
        save_shard(cache_dir / name, tensors, captions, indices, storage)
        shards.append({"file": name, "items": len(captions)} | ({"size": list(size)} if table is not None else {}))

    for batch in tqdm(loader, desc="precompute", disable=not state.is_main_process):
        bad_files.add(batch)
        size = tuple(batch["image"].shape[-2:])
        mean, std = vae.encode_posterior(to_model_range(batch["image"].to(device)))
        condition = text_encoder.encode(batch["caption"])
        posterior = {"latent_mean": mean} | ({} if std is None else {"latent_std": std})  # none: deterministic
        encoded = posterior | condition.cast(torch.float32).stored("text_")
        asked = next(source_items) if source_items is not None else None
        # The item each row holds: the one asked for, or the stand-in the source read for an unreadable one.
        encoded |= {"caption": batch["caption"], "items": batch.get("source_index", asked)}
        pending.setdefault(size, []).append({k: v.cpu() if torch.is_tensor(v) else v for k, v in encoded.items()})
        items += len(batch["caption"])
        if sum(len(b["caption"]) for b in pending[size]) >= data.cache_shard_size:
            flush(size)
    for size in list(pending):
        flush(size)
    skipped = bad_files.finish()
    record = {"shards": shards, "bad_files": skipped}
    (cache_dir / SHARD_LIST.format(rank=state.process_index)).write_text(json.dumps(record), encoding="utf-8")
    return items, skipped


def _write_json(path: Path, record: dict) -> None:
    write_text_atomically(path, json.dumps(record, indent=1))


def _write_prompts(sampled: Sequence[str], cache_dir: Path, known: list[str], text_encoder) -> list[str]:
    """Embed the prompts the run samples (``sampled``; those already cached are kept, in their rows): small, so rank
    0 does it alone."""
    prompts = list(dict.fromkeys([*known, *sampled]))
    condition = text_encoder.encode(prompts).cast(torch.float32)
    tensors = {key: tensor.cpu().contiguous() for key, tensor in condition.stored().items()}
    write_atomically(cache_dir / PROMPTS, lambda file: save_file(tensors, file))
    return prompts


def _write_index(cache_dtype: str, fingerprint: dict, cache_dir: Path, num_processes: int, prompts: list[str]) -> dict:
    shards, bad_files = [], []
    for rank in range(num_processes):
        record = json.loads((cache_dir / SHARD_LIST.format(rank=rank)).read_text(encoding="utf-8"))
        shards += record["shards"]
        bad_files += record["bad_files"]
    index = {
        "fingerprint": fingerprint,
        "items": sum(s["items"] for s in shards),
        "dtype": cache_dtype,
        "shards": shards,
        "prompts": prompts,
        "bad_files": bad_files,
    }
    _write_json(cache_dir / INDEX, index)  # the index appears only when the cache is complete
    for rank in range(num_processes):
        (cache_dir / SHARD_LIST.format(rank=rank)).unlink()
    return index


def precompute(
    *,
    model: ModelConfig,
    vae: VAEConfig,
    conditioner: ConditionerConfig,
    data: DataConfig,
    trainer: TrainerConfig,
    monitor: MonitorConfig,
) -> PrecomputeResult:
    """Write (or complete) the cache at ``data.cache_dir`` of a run with these sections (by name:
    ``call_with_sections(precompute, cfg)``): the images at the buckets ``model`` and ``vae`` allow, encoded by the
    ``vae`` and the ``conditioner``, and the prompts the run samples (``trainer``'s, the reward ``monitor``'s). An
    existing complete cache for the same settings and data only gets the prompts it lacks; one made with other
    settings is refused, never overwritten, and so is a folder that holds anything but a cache."""
    cache_dir = _cache_dir(data)
    _refuse_random_augmentation(data)
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    dtype = weight_dtype(resolve_mixed_precision(trainer.mixed_precision))
    buckets = configured_buckets(model, vae, data)
    sampled = sampled_prompts(trainer.sample_prompts, reward_monitor_prompts(monitor.reward))
    fingerprint = cache_fingerprint(data, vae, conditioner, buckets)  # of the data before encoding
    if (cache_dir / INDEX).is_file():
        index = read_index(cache_dir)
        check_fingerprint(index, fingerprint, cache_dir)
        items, bad_files = 0, index.get("bad_files", [])
        if state.is_main_process:  # the prompts file first: until the index names them, extra rows are unused
            text_encoder = build_text_encoder(conditioner, state.device, dtype)
            index["prompts"] = _write_prompts(sampled, cache_dir, index["prompts"], text_encoder)
            _write_json(cache_dir / INDEX, index)
    else:
        left = check_cache_folder(cache_dir)  # on every rank, so that a refusal stops them all
        state.wait_for_everyone()
        if state.is_main_process:
            cache_dir.mkdir(parents=True, exist_ok=True)
            for stale in left:  # what a precompute that did not finish wrote (its sizes index kept), and nothing else
                stale.unlink()
        state.wait_for_everyone()
        text_encoder = build_text_encoder(conditioner, state.device, dtype)
        autoencoder = build_vae(vae, state.device, dtype)
        check_resolution(model, data, autoencoder.downsample_factor)
        items, bad_files = _encode_images(data, trainer, buckets, cache_dir, state, autoencoder, text_encoder)
        state.wait_for_everyone()
        if state.is_main_process:
            prompts = _write_prompts(sampled, cache_dir, [], text_encoder)
            _write_index(data.cache_dtype, fingerprint, cache_dir, state.num_processes, prompts)
    state.wait_for_everyone()
    return PrecomputeResult(cache_dir, items, list(dict.fromkeys(bad_files)))
