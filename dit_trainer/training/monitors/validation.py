"""Validation loss: the diffusion loss on held-out images, made comparable across steps, runs and processes.

A training loss is noisy by construction (random images, timesteps, noise and dropped captions each step), and on
training images. Here every held-out image is encoded once (the posterior's mode), and evaluated at the same
stratified timesteps with noise drawn from a generator seeded by the image's index, without caption dropout. So a
checkpoint always gets the same number, and two runs' numbers compare whatever their batch size or timestep density.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from dit_trainer.data.buckets import in_order_loader
from dit_trainer.diffusion.loss import batch_condition, per_sample_mse
from dit_trainer.diffusion.schedule import NoiseSchedule
from dit_trainer.pixels import to_model_range
from dit_trainer.training.monitors.monitors import Monitor, MonitorContext, sampling_weights

logger = logging.getLogger(__name__)


def narrowest_exact(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in the narrowest float dtype that holds its values exactly: a cache's float16 or bfloat16 text
    embeddings, widened to float32 when read, go back to their storage size (the DiT casts them to its own dtype)."""
    for dtype in (torch.float16, torch.bfloat16):
        narrow = tensor.to(dtype)
        if torch.equal(narrow.to(tensor.dtype), tensor):
            return narrow
    return tensor


@torch.no_grad()
def encode_held_out(dataset: Dataset, vae, device: torch.device, batch_size: int) -> list[dict]:
    """The held-out items as fixed batches: normalised latents (the posterior's mode, on the CPU) and captions,
    plus the cached text embeddings when the data carries them, kept for the whole run in the size they were
    stored in (T5-XXL's for 1 % of a 1 M-image cache: 20 GB as float32). Encoded once, at the start of the run."""
    batches, skipped = [], []
    for batch in in_order_loader(dataset, batch_size):
        skipped += batch.pop("bad_files")
        if "image" in batch:
            latents = vae.encode(to_model_range(batch.pop("image").to(device)))
        else:  # a latent cache: its posteriors
            latents = vae.latents_from_posterior(
                batch.pop("latent_mean").to(device).float(), batch.pop("latent_std", None)
            )
        for key in ("text_embeds", "text_pooled"):
            if key in batch:
                batch[key] = narrowest_exact(batch[key])
        batches.append({"latents": latents.float().cpu(), **batch})
    if skipped:
        logger.warning(f"{len(skipped)} unreadable held-out files were skipped: {skipped[:5]}")
    return batches


def image_noise(seed: int, count: int, shape: torch.Size) -> torch.Tensor:
    """(count, *shape) standard normal noise of the held-out image whose generator is seeded with ``seed``."""
    return torch.randn((count, *shape), generator=torch.Generator().manual_seed(seed))


def validation_losses(
    batches: list[dict],
    dit: nn.Module,
    text_encoder,
    schedule: NoiseSchedule,
    timesteps: torch.Tensor,
    seed: int,
    device: torch.device,
) -> torch.Tensor:
    """(images, timesteps) unweighted MSE to the objective's target (the weighting differs between runs; the
    target does not)."""
    rows, first = [], 0
    for batch in batches:
        latents = batch["latents"].to(device)
        count = len(latents)
        noise = torch.stack([image_noise(seed + first + i, len(timesteps), latents.shape[1:]) for i in range(count)])
        noise = noise.to(device)
        condition = batch_condition(batch, text_encoder, 0.0, torch.Generator(device))
        losses = []
        for k, timestep in enumerate(timesteps):
            t = timestep.expand(count)
            noisy = schedule.add_noise(latents, noise[:, k], t)
            losses.append(per_sample_mse(dit(noisy, t, condition), schedule.target(latents, noise[:, k], t)))
        rows.append(torch.stack(losses, dim=1).cpu())
        first += count
    return torch.cat(rows)


def validation_metrics(losses: torch.Tensor, timesteps: torch.Tensor, num_train_timesteps: int) -> dict[str, float]:
    """``val/loss`` and ``val/loss/t_<timestep>`` per stratum (zero-padded, so they sort)."""
    width = len(str(num_train_timesteps - 1))
    metrics = {"val/loss": losses.double().mean().item()}
    for timestep, column in zip(timesteps.tolist(), losses.double().mean(dim=0).tolist()):
        metrics[f"val/loss/t_{int(timestep):0{width}d}"] = column
    return metrics


class ValidationMonitor(Monitor):
    """The validation loss with the EMA weights, on the main process (the held-out batches live there only)."""

    def __init__(
        self,
        context: MonitorContext,
        every_n_steps: int,
        batches: list[dict] | None,
        text_encoder,
        schedule: NoiseSchedule,
        timesteps: int,
        seed: int,
    ) -> None:
        super().__init__(context, every_n_steps)
        self.batches = batches
        self.text_encoder = text_encoder
        self.schedule = schedule
        self.timesteps = schedule.stratified_timesteps(timesteps, context.accelerator.device)
        self.seed = seed

    def run(self, dit: nn.Module, step: int) -> dict[str, float]:
        start = time.perf_counter()
        with sampling_weights(self.context.accelerator, dit, self.context.ema) as model:
            losses = validation_losses(
                self.batches, model, self.text_encoder, self.schedule, self.timesteps, self.seed, self.timesteps.device
            )
        metrics = validation_metrics(losses, self.timesteps, self.schedule.num_train_timesteps)
        return metrics | {"val/seconds": time.perf_counter() - start}
