"""The on-disk cache of what the frozen encoders make of a data set: written once by ``scripts/precompute.py``,
read by training instead of running the VAE encoder and the text encoder every step.

Layout of ``data.cache_dir``::

    index.json                      fingerprint, shapes, dtype, shards, the prompts of prompts.safetensors
    shard-RRRRR-KKKKK.safetensors   latent_mean, latent_std (the VAE posterior), text_embeds, text_mask; captions
    prompts.safetensors             embeddings of "" (caption dropout) and the sample / monitor prompts

The posterior's mean and std are kept, not one latent, so training still draws a fresh latent every epoch. The
fingerprint records everything that shaped the tensors; a cache made with other settings is refused, never trained
on. Each rank of a multi-process precompute writes its own shards (``RRRRR`` = rank); rank 0 writes the index last,
so a cache without ``index.json`` is incomplete and is refused.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset

from dit_trainer.errors import ConfigError
from dit_trainer.prompts import load_prompts

if TYPE_CHECKING:
    from dit_trainer.config import TrainConfig

INDEX = "index.json"
PROMPTS = "prompts.safetensors"
FORMAT_VERSION = 1
TENSOR_KEYS = ("latent_mean", "latent_std", "text_embeds", "text_mask")
IN_MEMORY_BYTES = 2 << 30  # as stored; float16 doubles in memory
STORAGE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}  # data.cache_dtype
# Settings that change nothing in the cached tensors: reading options and training-time augmentation knobs.
NOT_FINGERPRINTED = (
    "caption_dropout",
    "max_bad_fraction",
    "num_workers",
    "prefetch_factor",
    "cache_latents",
    "cache_dir",
    "cache_shard_size",
    "shuffle_buffer",
)


def cache_fingerprint(cfg: TrainConfig) -> dict:
    """Everything that shaped the cached tensors: the VAE, the text encoder and how images and captions were read."""
    data = {k: v for k, v in asdict(cfg.data).items() if k not in NOT_FINGERPRINTED}
    text = cfg.text_encoder
    return {
        "format": FORMAT_VERSION,
        "vae": asdict(cfg.vae),
        "text_encoder": {k: getattr(text, k) for k in ("pretrained", "kind", "subfolder", "revision", "max_length")},
        "data": data,
    }


def cache_prompts(cfg: TrainConfig) -> list[str]:
    """The prompts a run needs embedded besides its captions: "" (caption dropout, CFG) and what it samples."""
    grpo = cfg.monitor.grpo
    monitor = load_prompts(grpo.prompts, grpo.prompt_file, "monitor.grpo.") if grpo.enabled else []
    return list(dict.fromkeys(["", *cfg.trainer.sample_prompts, *monitor]))


def _differences(saved: dict, wanted: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(saved) | set(wanted))
    found = []
    for key in keys:
        a, b = saved.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append(f"{prefix}{key}: cache {a!r}, config {b!r}")
    return found


def read_index(cache_dir: Path) -> dict:
    """The index of a complete cache; a missing or partial cache is a ``ConfigError`` naming ``data.cache_dir``."""
    path = cache_dir / INDEX
    if not path.is_file():
        raise ConfigError(
            "data.cache_dir",
            str(cache_dir),
            f"there is no complete cache there (no {INDEX}: never written, or its precompute did not finish)",
            "write it with `python scripts/precompute.py <the same overrides as train.py>`",
        )
    return json.loads(path.read_text(encoding="utf-8"))


def check_fingerprint(index: dict, cfg: TrainConfig, cache_dir: Path) -> None:
    """Refuse a cache made with other settings: training on it would silently learn from the wrong inputs."""
    differences = _differences(index["fingerprint"], cache_fingerprint(cfg))
    if differences:
        shown = "; ".join(differences[:4]) + (f"; and {len(differences) - 4} more" if len(differences) > 4 else "")
        raise ConfigError(
            "data.cache_dir",
            str(cache_dir),
            f"the cache was made with other settings than this run's ({shown})",
            "train with the settings the cache was made with, or write a new cache for these settings with "
            "`python scripts/precompute.py ... data.cache_dir=<new folder>`",
        )


class CacheDataset(Dataset):
    """Items ``{"latent_mean", "latent_std", "text_embeds", "text_mask", "caption"}`` as float32 / int64.

    A cache up to ``IN_MEMORY_BYTES`` is read into memory once (indexing it costs microseconds, so the cache never
    slows a step); a larger one is read row by row from the memory-mapped shards, so it needs no RAM of its own.
    """

    def __init__(self, cache_dir: Path, index: dict) -> None:
        self.shards = [cache_dir / shard["file"] for shard in index["shards"]]
        self.offsets = [0]
        for shard in index["shards"]:
            self.offsets.append(self.offsets[-1] + shard["items"])
        self._handles: dict[int, object] = {}  # opened lazily, so each DataLoader worker opens its own
        self.captions = [c for k in range(len(self.shards)) for c in json.loads(self._handle(k).metadata()["captions"])]
        self.in_memory = sum(path.stat().st_size for path in self.shards) <= IN_MEMORY_BYTES
        if self.in_memory:  # already as float32 / int64: an item is then a view, no conversion per step
            shards = [load_file(path) for path in self.shards]
            self.tensors = {key: self._widen(torch.cat([shard[key] for shard in shards])) for key in shards[0]}
        self._handles.clear()

    def __len__(self) -> int:
        return self.offsets[-1]

    def _handle(self, shard: int):
        if shard not in self._handles:
            self._handles[shard] = safe_open(str(self.shards[shard]), framework="pt")
        return self._handles[shard]

    @staticmethod
    def _widen(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.float() if tensor.is_floating_point() else tensor.long()

    def _row(self, key: str, index: int) -> torch.Tensor:
        if self.in_memory:
            return self.tensors[key][index]
        shard = bisect.bisect_right(self.offsets, index) - 1
        row = index - self.offsets[shard]
        return self._widen(self._handle(shard).get_slice(key)[row : row + 1][0])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | str]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        item = {key: self._row(key, index) for key in TENSOR_KEYS}
        return item | {"caption": self.captions[index]}

    def __getitems__(self, indices: list[int]) -> dict[str, Any] | list[dict[str, Any]]:
        """A whole batch at once (the DataLoader calls this when it exists). In memory: one gather per tensor,
        handed to ``collate_batch`` as the batch itself, so no per-item views are made and stacked again."""
        if not self.in_memory or not indices:  # an empty list: a Poisson draw (DP) that selected nothing
            return [self[index] for index in indices]
        rows = torch.as_tensor(indices, dtype=torch.long)
        batch = {key: self.tensors[key].index_select(0, rows) for key in TENSOR_KEYS}  # faster than [rows]
        return batch | {"caption": [self.captions[index] for index in indices], "bad_files": []}


class CachedPrompts:
    """Stands in for the text encoder when training from a cache: the embeddings of the prompts precompute was
    told about (``cache_prompts``), so the real encoder is never loaded."""

    def __init__(self, prompts: list[str], embeds: torch.Tensor, mask: torch.Tensor, device: torch.device) -> None:
        self.rows = {prompt: row for row, prompt in enumerate(prompts)}
        self.embeds, self.mask = embeds.float().to(device), mask.long().to(device)

    @property
    def hidden_size(self) -> int:
        return self.embeds.shape[-1]

    @property
    def device(self) -> torch.device:
        return self.embeds.device

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        missing = [p for p in prompts if p not in self.rows]
        if missing:
            raise ConfigError(
                "data.cache_dir",
                "",
                f"the cache holds no embedding for the prompts {missing[:3]} (sample and monitor prompts are "
                "embedded by precompute)",
                "run `python scripts/precompute.py` again with this run's overrides: it adds the missing prompts "
                "without re-encoding the images",
            )
        rows = torch.tensor([self.rows[p] for p in prompts], device=self.embeds.device)
        return self.embeds[rows], self.mask[rows]


def open_cache(cfg: TrainConfig, device: torch.device) -> tuple[CacheDataset, CachedPrompts]:
    """The cache at ``data.cache_dir``, checked against this run's settings and prompts."""
    cache_dir = Path(str(cfg.data.cache_dir)).expanduser()
    index = read_index(cache_dir)
    check_fingerprint(index, cfg, cache_dir)
    prompts = load_file(cache_dir / PROMPTS)
    text = CachedPrompts(index["prompts"], prompts["embeds"], prompts["mask"], device)
    text.encode(cache_prompts(cfg))  # a missing sample/monitor prompt fails now, not at the first sample grid
    return CacheDataset(cache_dir, index), text


def shard_name(rank: int, number: int) -> str:
    return f"shard-{rank:05d}-{number:05d}.safetensors"


def save_shard(path: Path, tensors: dict[str, torch.Tensor], captions: list[str], dtype: torch.dtype) -> None:
    """One shard, float tensors in the storage ``dtype``. NaN/inf is refused here, at write time (an encoder that
    overflowed, or values beyond float16's range), rather than poisoning every epoch of training."""
    stored = {k: (v.to(dtype) if v.is_floating_point() else v.to(torch.int8)).contiguous() for k, v in tensors.items()}
    for key, value in stored.items():
        if value.is_floating_point() and not torch.isfinite(value).all():
            bad = (~torch.isfinite(value.flatten(1))).any(1).nonzero().flatten().tolist()
            raise ConfigError(
                "data.cache_dtype",
                str(dtype).removeprefix("torch."),
                f"{key} is NaN/inf for {len(bad)} items of {path.name} (captions {[captions[i] for i in bad[:3]]}): "
                "the encoder overflowed or the values exceed the storage dtype",
                "precompute in float32 (`trainer.mixed_precision=no`), store as `data.cache_dtype=bfloat16` or "
                "float32, or check those images",
            )
    save_file(stored, path, metadata={"captions": json.dumps(captions)})
