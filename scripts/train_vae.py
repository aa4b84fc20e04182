"""Train the tiny ``AutoencoderKL`` that ``experiment=shapes`` ships under ``dit_trainer/assets/shapes_vae``.

The VAE is trained on the shapes data set (reconstruction MSE + a small KL term, as in Stable Diffusion's VAE),
then the per-channel mean and std of its latents are written into its config (``latents_mean``/``latents_std``):
its channels have very uneven scales, and one global ``scaling_factor`` would leave some near-silent.

    python scripts/train_vae.py --out dit_trainer/assets/shapes_vae   # ~10 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from diffusers import AutoencoderKL
from torch.utils.data import DataLoader

from dit_trainer.data.sources.shapes import ShapesDataset


def build_tiny_vae(resolution: int) -> AutoencoderKL:
    """0.66 M parameters; 32 px images become 4 x 16 x 16 latents."""
    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        latent_channels=4,
        sample_size=resolution,
        scaling_factor=1.0,
    )


@torch.no_grad()
def latent_statistics(vae: AutoencoderKL, loader: DataLoader, batches: int) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the posterior means over ``batches`` batches."""
    latents = []
    for _, batch in zip(range(batches), loader):
        latents.append(vae.encode(batch["image"]).latent_dist.mean)
    stacked = torch.cat(latents).transpose(0, 1).flatten(1)
    return stacked.mean(dim=1).tolist(), stacked.std(dim=1).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--kl-weight", type=float, default=1e-6)
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("dit_trainer/assets/shapes_vae"))
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    vae = build_tiny_vae(args.resolution)
    data = ShapesDataset(length=args.steps * args.batch_size, resolution=args.resolution, seed=args.seed + 1)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    start = time.perf_counter()
    for step, batch in enumerate(loader, start=1):
        images = batch["image"]
        posterior = vae.encode(images).latent_dist
        reconstruction = vae.decode(posterior.sample()).sample
        mse = torch.nn.functional.mse_loss(reconstruction, images)
        loss = mse + args.kl_weight * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == args.steps:
            print(f"step {step} mse {mse.item():.5f} ({time.perf_counter() - start:.0f} s)", flush=True)
        if step == args.steps:
            break

    vae.eval()
    mean, std = latent_statistics(vae, DataLoader(ShapesDataset(4096, args.resolution, seed=7), batch_size=256), 16)
    vae.register_to_config(latents_mean=mean, latents_std=std)
    vae.save_pretrained(args.out)
    print(f"latents mean {[round(m, 3) for m in mean]} std {[round(s, 3) for s in std]}; saved to {args.out}")


if __name__ == "__main__":
    main()
