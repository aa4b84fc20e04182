"""FID and KID of generated images against a run's validation images, with torchmetrics' implementations.

Features come from a named extractor: ``inception`` is the standard one (InceptionV3 pool features, 2048-d, with
torch-fidelity's weights loaded by torchmetrics' own code, or a local copy of that file for offline clusters);
``vae`` is the run's own frozen VAE encoder, its posterior mean pooled to a 4 x 4 grid: offline and cheap, but
comparable only between runs that share the VAE. The validation images' features are computed once per data set
and extractor and cached under a fingerprint of everything that determines them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dit_trainer.config import DataConfig, VAEConfig, ValidationConfig
from dit_trainer.data import SOURCES
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.mixture import entry_config
from dit_trainer.data.split import unaugmented, validation_images
from dit_trainer.durable import write_atomically
from dit_trainer.errors import ConfigError, require
from dit_trainer.pixels import to_model_range

logger = logging.getLogger(__name__)
KID_SUBSET_SIZE = 1000  # torchmetrics' default; smaller sets use all their images per subset
MIN_FID_IMAGES = 2  # a covariance needs two images (and KID's unbiased estimate two per subset)


class InceptionFeatures(nn.Module):
    """The 2048-d pool features of the FID Inception network, as torchmetrics loads it (torch-fidelity's
    weights, downloaded once, or ``weights_path``)."""

    def __init__(self, weights_path: str | None = None) -> None:
        super().__init__()
        from torchmetrics.image.fid import NoTrainInceptionV3  # needs torch-fidelity: see require_feature_extractor

        self.network = NoTrainInceptionV3(
            name="inception-v3-compat", features_list=["2048"], feature_extractor_weights_path=weights_path
        )
        self.identity = {"name": "inception", "weights": weights_path}

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.network((images * 255).round().to(torch.uint8))


class LatentFeatures(nn.Module):
    """A frozen VAE encoder's posterior mean, average-pooled to ``grid`` x ``grid``: (B, channels x grid^2)."""

    def __init__(self, vae, identity: dict, grid: int = 4) -> None:
        super().__init__()
        self.vae = vae
        self.grid = grid
        self.identity = {"name": "vae", "grid": grid, **identity}

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        mean, _ = self.vae.encode_posterior(images * 2 - 1)
        return F.adaptive_avg_pool2d(mean, self.grid).flatten(1)


def require_feature_extractor(features: str, weights_path: str | None, key: str, weights_key: str) -> None:
    """Refuse features that cannot be extracted on this machine (Inception without torch-fidelity, or with a weights
    file that is not there) from the arguments alone, before any model loads or any image is sampled."""
    if features != "inception":
        return
    from torchmetrics.utilities.imports import _TORCH_FIDELITY_AVAILABLE

    require(
        bool(_TORCH_FIDELITY_AVAILABLE),
        key,
        features,
        "the standard Inception features need torch-fidelity, which is not installed",
        "`pip install torch-fidelity` (it needs the torchvision build that matches your torch), or use the run's own "
        f"VAE as an offline feature extractor: `{key}=vae`",
    )
    require(
        weights_path is None or Path(weights_path).expanduser().is_file(),
        weights_key,
        weights_path,
        "it must be a local copy of torch-fidelity's Inception weights file, and there is no file there",
        f"pass the path of weights-inception-2015-12-05-6726825d.pth, or `{weights_key}=null` to download it once",
    )


def build_feature_extractor(
    features: str, weights_path: str | None, vae: nn.Module, vae_cfg: VAEConfig, device: torch.device
) -> nn.Module:
    """``inception`` (from ``weights_path`` when given; ``require_feature_extractor`` first) or ``vae``: the run's
    frozen VAE encoder."""
    if features == "inception":
        return InceptionFeatures(weights_path).to(device)
    return LatentFeatures(vae, {"kind": vae_cfg.kind, "pretrained": vae_cfg.pretrained})


@torch.no_grad()
def extract_features(extractor: nn.Module, batches: Iterable[torch.Tensor], device: torch.device) -> torch.Tensor:
    """(N, d) float64 features of image batches in [0, 1], on the CPU."""
    return torch.cat([extractor(images.to(device)).double().cpu() for images in batches])


@dataclass
class ReferenceSet:
    """The validation images as FID sees them: their features (N, d) and captions (what samples are drawn for)."""

    features: torch.Tensor
    captions: list[str]


def reference_set(dataset: Dataset, extractor: nn.Module, device: torch.device, batch_size: int) -> ReferenceSet:
    """The features and captions of every image of ``dataset``."""
    captions: list[str] = []

    def images() -> Iterator[torch.Tensor]:
        for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collate_batch):
            captions.extend(batch["caption"])
            yield (to_model_range(batch["image"]) + 1) / 2

    return ReferenceSet(extract_features(extractor, images(), device), captions)


def cached_reference_set(cache_dir: Path, fingerprint: dict, compute: Callable[[], ReferenceSet]) -> ReferenceSet:
    """The reference set stored under ``fingerprint`` in ``cache_dir``, computed (and stored atomically) when
    absent; a file that is unreadable or holds another fingerprint is recomputed, never trusted."""
    text = json.dumps(fingerprint, sort_keys=True)
    path = cache_dir / f"{hashlib.sha256(text.encode()).hexdigest()[:20]}.safetensors"
    if path.exists():
        try:
            with safe_open(path, "pt") as stored:
                metadata = stored.metadata()
                if metadata["fingerprint"] == text:
                    return ReferenceSet(stored.get_tensor("features"), json.loads(metadata["captions"]))
        except (OSError, KeyError, RuntimeError, ValueError, SafetensorError) as error:
            logger.warning(f"recomputing the FID reference features: {path} could not be read ({error})")
    reference = compute()
    metadata = {"fingerprint": text, "captions": json.dumps(reference.captions)}
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda temporary: save_file({"features": reference.features}, temporary, metadata))
    except (OSError, SafetensorError) as error:  # a cache: the numbers stand without it
        logger.warning(f"the FID reference features could not be cached in {cache_dir} ({error}); set fid_cache_dir")
    else:
        logger.info(f"FID reference features of {len(reference.captions)} images cached in {path}")
    return reference


class _Precomputed(nn.Identity):
    """Hands features already extracted to torchmetrics' metrics, which otherwise extract their own."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.num_features = num_features


def distances(real: torch.Tensor, fake: torch.Tensor, seed: int = 0) -> dict[str, float]:
    """FID and KID (mean, std over torchmetrics' 100 random subsets, drawn from ``seed``) between two feature
    sets (N, d) of at least ``MIN_FID_IMAGES`` each (the callers refuse fewer before sampling)."""
    from torchmetrics.image.fid import FrechetInceptionDistance  # here: every run imports this module, few use FID
    from torchmetrics.image.kid import KernelInceptionDistance

    dims = real.shape[1]
    fid = FrechetInceptionDistance(feature=_Precomputed(dims))
    subset = min(KID_SUBSET_SIZE, len(real), len(fake))
    with warnings.catch_warnings():  # "KID will save all extracted features": these are already in memory
        warnings.simplefilter("ignore", UserWarning)
        kid = KernelInceptionDistance(feature=_Precomputed(dims), subset_size=subset)
    for metric in (fid, kid):
        metric.update(real, real=True)
        metric.update(fake, real=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        kid_mean, kid_std = kid.compute()
    return {"fid": fid.compute().item(), "kid_mean": kid_mean.item(), "kid_std": kid_std.item()}


def reference_fingerprint(data: DataConfig, validation: ValidationConfig, extractor: nn.Module) -> dict:
    """What the validation images' features depend on: the data (every source of a mixture), its content where a
    source can tell cheaply, the held-out selection, and the feature extractor."""
    fields = ("source", "path", "split", "image_column", "caption_column", "caption_columns", "resolution", "crop")
    sources = [entry_config(data, entry) for entry in data.mixture] or [data]
    if validation.path:  # validation reads a data set of its own, of the same kind
        sources = [dataclasses.replace(data, path=validation.path, mixture=[])]
    return {
        "data": {name: getattr(data, name) for name in fields} | {"length": data.length, "seed": data.seed},
        "sources": [
            {"source": source.source, "path": source.path, "split": source.split, "content": _content(source)}
            for source in sources
        ],
        "held_out": {"split": validation.split, "seed": validation.seed, "path": validation.path},
        "features": extractor.identity,
    }


def _content(data: DataConfig) -> dict | None:
    """What identifies a source's data beyond its config (None where the config alone does: shapes)."""
    content = SOURCES.get(data.source).content
    return content(unaugmented(data, data.path)) if content else None


def reference_cache_dir(cache_dir: str | None, data: DataConfig, run_dir: Path) -> Path:
    """Where the validation images' features are kept: ``cache_dir`` (the user's setting), else beside the run's
    latent cache (``data.cache_dir/fid_reference``), else in the run's own folder (``run_dir/fid_reference``, which
    the training monitor and ``scripts/evaluate.py`` of that run share): never a folder nobody chose, such as the
    user's home, where every run would write and read."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if data.cache_dir:
        return Path(data.cache_dir).expanduser() / "fid_reference"
    return run_dir / "fid_reference"


def validation_reference(
    data: DataConfig,
    validation: ValidationConfig,
    extractor: nn.Module,
    cache_dir: str | Path,
    device: torch.device,
    batch_size: int,
) -> ReferenceSet:
    """The features and captions of the run's validation images, computed once and cached in ``cache_dir``
    (``reference_cache_dir``'s answer)."""
    held_out = validation_images(data, validation)
    if held_out is None:  # the training checks refuse a FID monitor without validation; evaluate.py checks here
        raise ConfigError(
            "metrics",
            ["fid"],
            "FID compares samples with the run's validation images, and this run holds none out (its "
            "`validation.every_n_steps` is 0)",
            "train with validation (`validation.every_n_steps=5000 validation.split=0.01`, or `validation.path=...`)",
        )
    return cached_reference_set(
        Path(cache_dir),
        reference_fingerprint(data, validation, extractor),
        lambda: reference_set(held_out, extractor, device, batch_size),
    )


def check_reference_size(reference: ReferenceSet, key: str, value: Any, fix: str) -> None:
    """A reference of one image has no covariance: refused when it is computed, not at the first FID after
    sampling (``key``/``value``/``fix``: the setting that chose the validation images)."""
    require(
        len(reference.captions) >= MIN_FID_IMAGES,
        key,
        value,
        f"FID and KID compare the validation images' feature statistics with the samples', and "
        f"{len(reference.captions)} readable validation image(s) give no covariance (at least {MIN_FID_IMAGES} "
        "are needed)",
        fix,
    )


def sample_count(reference: ReferenceSet, count: int | None) -> int:
    """The samples an FID generates: ``count``, default one per reference image."""
    return count or len(reference.captions)


def small_sample_warning(samples: int, reference: ReferenceSet) -> str | None:
    """Why an FID of so few samples is not comparable, when fewer samples (or reference images) than feature
    dimensions make both covariance estimates rank-deficient: the value then depends strongly on the count."""
    smallest, dims = min(samples, len(reference.captions)), reference.features.shape[1]
    if smallest >= dims:
        return None
    return (
        f"FID from {samples} samples against {len(reference.captions)} validation images of {dims}-dimensional "
        f"features: with fewer images than dimensions the value is dominated by the sample count (the standard FID "
        "uses 10,000 or 50,000), so compare it only with FIDs of the same counts and features"
    )


def sample_distances(
    generate: Callable[[list[str], list[int]], torch.Tensor],
    reference: ReferenceSet,
    extractor: nn.Module,
    count: int | None,
    seed: int,
    batch_size: int,
    device: torch.device,
) -> dict[str, float]:
    """FID and KID of ``count`` samples (default: one per reference image; sample ``i`` for reference caption
    ``i``, cycled, with seed ``seed + i``) against the reference set, with the counts they were computed from."""
    count = sample_count(reference, count)
    prompts = [reference.captions[i % len(reference.captions)] for i in range(count)]
    images = generate(prompts, [seed + i for i in range(count)])
    samples = extract_features(extractor, images.split(batch_size), device)
    return {
        "fid_images": count,
        "fid_reference_images": len(reference.captions),
        "fid_feature_dims": reference.features.shape[1],
        **distances(reference.features, samples, seed),
    }
