"""An in-memory latent cache: encode every image once with the frozen VAE, then train from the posteriors.

The VAE encoder can cost more than the DiT step itself (it does on the shapes default), and a frozen encoder gives
the same posterior every epoch. The cache keeps the posterior's
mean and std, not one latent, so each epoch still draws a fresh latent, exactly as on-the-fly encoding would.
"""

from __future__ import annotations

import logging

import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from dit_trainer.data.cache import refuse_non_finite
from dit_trainer.data.collate import collate_batch

logger = logging.getLogger(__name__)


class LatentDataset(Dataset):
    """``{"latent_mean", "latent_std", "caption"}`` per item, in the order of the source data set."""

    def __init__(self, means: torch.Tensor, stds: torch.Tensor, captions: list[str]) -> None:
        self.means, self.stds, self.captions = means, stds, captions

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor | str]:
        return {"latent_mean": self.means[index], "latent_std": self.stds[index], "caption": self.captions[index]}


@torch.no_grad()
def encode_dataset(
    dataset: Dataset, vae, device: torch.device, batch_size: int = 256, num_workers: int = 0, show_progress: bool = True
) -> LatentDataset:
    """Run the VAE encoder over ``dataset`` once; results stay on the CPU. NaN/inf is refused as the disk cache
    refuses it: here it would be drawn from at every step."""
    means, stds, captions, bad_files = [], [], [], []
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_batch)
    for batch in tqdm(loader, desc="encode latents", disable=not show_progress):
        bad_files += batch["bad_files"]
        mean, std = vae.encode_posterior(batch["image"].to(device))
        refuse_non_finite(
            {"latent_mean": mean, "latent_std": std},
            batch["caption"],
            "data.cache_latents",
            True,
            "",
            "the VAE encoder overflowed, and every epoch would train on them",
            "encode in float32 (`trainer.mixed_precision=no`) or remove those images from the data set",
        )
        means.append(mean.cpu())
        stds.append(std.cpu())
        captions.extend(batch["caption"])
    if bad_files:
        logger.warning(f"{len(bad_files)} unreadable files were skipped while caching latents: {bad_files[:5]}")
    return LatentDataset(torch.cat(means), torch.cat(stds), captions)
