"""An in-memory latent cache: encode every image once with the frozen VAE, then train from the posteriors.

The VAE encoder can cost more than the DiT step itself (it does on the shapes default), and a frozen encoder gives
the same posterior every epoch. The cache keeps the posterior's
mean and std, not one latent, so each epoch still draws a fresh latent, exactly as on-the-fly encoding would.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from dit_trainer.config import DataConfig
from dit_trainer.data.bad_files import PassBadFiles
from dit_trainer.data.buckets import in_order_loader, item_buckets
from dit_trainer.data.cache.cache import refuse_non_finite
from dit_trainer.data.mixture import item_sources
from dit_trainer.pixels import to_model_range

logger = logging.getLogger(__name__)


class LatentDataset(Dataset):
    """``{"latent_mean", "latent_std", "caption"}`` per item (no ``latent_std`` for a deterministic autoencoder, whose
    ``stds`` is None), in the order of the source data set. ``buckets`` and
    ``sources`` are the source's (each item's bucket, with buckets the tensors differ in size between them; each
    item's data set, for a mixture)."""

    def __init__(
        self,
        means: Sequence[torch.Tensor],
        stds: Sequence[torch.Tensor] | None,
        captions: list[str],
        buckets: list[int] | None = None,
        sources: list[int] | None = None,
    ) -> None:
        self.means, self.stds, self.captions = means, stds, captions
        self.buckets, self.sources = buckets, sources

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | str]:
        item = {"latent_mean": self.means[index], "caption": self.captions[index]}
        return item if self.stds is None else item | {"latent_std": self.stds[index]}


@torch.no_grad()
def encode_dataset(
    dataset: Dataset,
    vae,
    device: torch.device,
    batch_size: int = 256,
    num_workers: int = 0,
    show_progress: bool = True,
    bad_files: PassBadFiles | None = None,
) -> LatentDataset:
    """Run the VAE encoder over ``dataset`` once; results stay on the CPU. NaN/inf is refused as the disk cache
    refuses it: here it would be drawn from at every step. The unreadable files skipped go to ``bad_files`` (by
    default the limit of a default data section), which stops the encoding when they are too many: the training
    loop never sees them again."""
    means, stds, captions = [], [], []
    bad_files = bad_files or PassBadFiles.over(DataConfig(), dataset)
    loader = in_order_loader(dataset, batch_size, num_workers)
    for batch in tqdm(loader, desc="encode latents", disable=not show_progress):
        bad_files.add(batch)
        mean, std = vae.encode_posterior(to_model_range(batch["image"].to(device)))
        refuse_non_finite(
            {"latent_mean": mean} | ({} if std is None else {"latent_std": std}),
            batch["caption"],
            "data.cache_latents",
            True,
            "",
            "the VAE encoder overflowed, and every epoch would train on them",
            "encode in float32 (`trainer.mixed_precision=no`) or remove those images from the data set",
        )
        means.append(mean.cpu())
        stds.append(None if std is None else std.cpu())
        captions.extend(batch["caption"])
    if skipped := bad_files.finish():
        logger.warning(f"{len(skipped)} unreadable files were skipped while caching latents: {skipped[:5]}")
    buckets, sources = item_buckets(dataset), item_sources(dataset)
    deterministic = stds[0] is None if stds else False
    if buckets is None:  # one stacked tensor: cheaper to index than a list of them
        return LatentDataset(torch.cat(means), None if deterministic else torch.cat(stds), captions, sources=sources)
    order = [index for batch in loader.batch_sampler for index in batch]  # read bucket by bucket
    ordered = sorted(range(len(order)), key=order.__getitem__)  # back in the source's order
    means = [means_item for batch in means for means_item in batch]
    stds = None if deterministic else [item for batch in stds for item in batch]
    return LatentDataset(
        [means[at] for at in ordered],
        None if stds is None else [stds[at] for at in ordered],
        [captions[at] for at in ordered],
        buckets,
        sources,
    )
