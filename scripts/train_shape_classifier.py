"""Train the CNN that the ``shapes_classifier`` reward ships under ``dit_trainer/assets/shape_classifier``.

It is the shapes recipes' gold judge, so it must not be the training judge (template matching) in disguise: it
learns from the data set's own renders (``shape_spec`` draws size and position) degraded as a DiT degrades images,
Gaussian blur of random radius, down-and-up resampling, JPEG, white and blotchy noise, brightness, contrast and tint
shifts, plus grey images with nothing on them (the ``nothing`` shape). Held-out accuracies on fresh seeds (clean,
blurred, noisy, the training mix, and round trips through the shapes VAE with noisy latents, a degradation it never
saw) are measured with the saved files and written into the asset's config.

    python scripts/train_shape_classifier.py --out dit_trainer/assets/shape_classifier   # ~3 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

from dit_trainer.data.sources.shapes import BACKGROUND, COLORS, SHAPES, classify, render, shape_spec
from dit_trainer.rewards.shape_classifier import (
    CONFIG_NAME,
    NOTHING,
    WEIGHTS_NAME,
    ShapeClassifier,
    ShapeClassifierNet,
    verdicts,
)

RESOLUTION = 32
IGNORE = -100  # the colour target of an image with nothing on it
VAE = Path(__file__).resolve().parents[1] / "dit_trainer" / "assets" / "shapes_vae"


def draw(count: int, seed: int, generator: np.random.Generator, blank: float) -> tuple[torch.Tensor, list[str]]:
    """``count`` renders of random items of the shapes data set with ``seed`` (images (B, 3, H, W) in [0, 1] and
    captions); a share ``blank`` of them grey with nothing drawn, captioned ``"a - nothing"``."""
    images, captions = [], []
    for index in generator.integers(0, 2**31, size=count).tolist():
        color, shape, size, top, left = shape_spec(index, seed, RESOLUTION, RESOLUTION)
        if generator.random() < blank:
            images.append(np.broadcast_to(np.asarray(BACKGROUND, np.uint8), (RESOLUTION, RESOLUTION, 3)))
            captions.append(f"a - {NOTHING}")
        else:
            images.append(render(color, shape, size, top, left, RESOLUTION))
            captions.append(f"a {color} {shape}")
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255, captions


def targets(captions: list[str], shapes: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(colour index or IGNORE, shape index) of each caption."""
    pairs = [caption.removeprefix("a ").split(" ", 1) for caption in captions]
    colors = [list(COLORS).index(color) if shape != NOTHING else IGNORE for color, shape in pairs]
    return torch.tensor(colors), torch.tensor([shapes.index(shape) for _, shape in pairs])


def uniform(count: int, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(count, generator=generator)


def gaussian_blur(images: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """Each image blurred with its own sigma (pixels), edges extended (the background is uniform)."""
    batch, channels, height, width = images.shape
    offsets = torch.arange(-3, 4, dtype=torch.float32)
    line = torch.exp(-(offsets**2) / (2 * sigmas[:, None].clamp_min(1e-3) ** 2))
    line = line / line.sum(1, keepdim=True)
    kernels = (line[:, :, None] * line[:, None, :]).repeat_interleave(channels, 0)[:, None]  # (B*C, 1, 7, 7)
    padded = F.pad(images.reshape(1, batch * channels, height, width), (3, 3, 3, 3), mode="replicate")
    return F.conv2d(padded, kernels, groups=batch * channels).reshape(images.shape)


def resample(images: torch.Tensor, factor: int) -> torch.Tensor:
    """Down by ``factor`` (area) and back up (bilinear): the soft, slightly blocky look of a low-resolution latent."""
    small = F.interpolate(images, scale_factor=1 / factor, mode="area")
    return F.interpolate(small, size=images.shape[-2:], mode="bilinear", align_corners=False)


def jpeg(images: torch.Tensor, qualities: list[int]) -> torch.Tensor:
    """Each image through a JPEG encode and decode at its quality: blocking and chroma smearing."""
    pixels = (images.permute(0, 2, 3, 1).clamp(0, 1) * 255).round().byte().numpy()
    out = []
    for image, quality in zip(pixels, qualities):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
        out.append(np.asarray(Image.open(buffer).convert("RGB")))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).float() / 255


def noise(images: torch.Tensor, sigmas: torch.Tensor, grid: int, generator: torch.Generator) -> torch.Tensor:
    """Gaussian noise of each image's sigma, white (``grid`` = the image size) or blotchy (a coarse ``grid`` of
    noise, upsampled: the uneven backgrounds a DiT leaves)."""
    field = torch.randn((len(images), 3, grid, grid), generator=generator)
    field = F.interpolate(field, size=images.shape[-2:], mode="bilinear", align_corners=False)
    return images + sigmas.view(-1, 1, 1, 1) * field


def degrade(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The training mix: a small brightness, contrast and tint shift for every image, then each of blur,
    resampling, JPEG, white noise and blotchy noise for a random share of them."""
    batch = len(images)
    contrast = uniform(batch, 0.8, 1.2, generator).view(-1, 1, 1, 1)
    tint = uniform(batch * 3, -0.04, 0.04, generator).view(batch, 3, 1, 1)
    images = (images - 0.5) * contrast + 0.5 + uniform(batch, -0.08, 0.08, generator).view(-1, 1, 1, 1) + tint
    changes = [
        (0.4, lambda x: gaussian_blur(x, uniform(len(x), 0.3, 1.5, generator))),
        (0.3, lambda x: resample(x, int(torch.randint(2, 4, (), generator=generator)))),
        (0.25, lambda x: jpeg(x, torch.randint(15, 61, (len(x),), generator=generator).tolist())),
        (0.6, lambda x: noise(x, uniform(len(x), 0.0, 0.08, generator), RESOLUTION, generator)),
        (0.3, lambda x: noise(x, uniform(len(x), 0.0, 0.06, generator), 8, generator)),
    ]
    for share, change in changes:
        chosen = torch.rand(batch, generator=generator) < share
        if chosen.any():
            images[chosen] = change(images[chosen])
    return images.clamp(0, 1)


@torch.no_grad()
def vae_round_trip(images: torch.Tensor, generator: torch.Generator, latent_noise: float) -> torch.Tensor:
    """``images`` through the shapes VAE, with Gaussian noise of ``latent_noise`` (in units of each latent channel's
    std) added to the latents: a DiT's imperfect latents, decoded as a recipe decodes them."""
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(VAE).eval()
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1)
    out = []
    for chunk in images.split(256):
        latents = vae.encode(chunk * 2 - 1).latent_dist.mean
        latents = latents + latent_noise * std * torch.randn(latents.shape, generator=generator)
        out.append((vae.decode(latents).sample.clamp(-1, 1) + 1) / 2)
    return torch.cat(out)


def accuracies(classifier: ShapeClassifier, images: torch.Tensor, captions: list[str]) -> dict[str, float]:
    """Colour and shape accuracy of the classifier and, for comparison, of the template judge."""
    color_ok, shape_ok = verdicts(classifier.read(images), captions)
    template = classify(images)
    expected = [caption.removeprefix("a ").split(" ", 1) for caption in captions]
    return {
        "images": len(captions),
        "color": round(color_ok.mean().item(), 4),
        "shape": round(shape_ok.mean().item(), 4),
        "template_color": round(float(np.mean([s[0] == e[0] for s, e in zip(template, expected)])), 4),
        "template_shape": round(float(np.mean([s[1] == e[1] for s, e in zip(template, expected)])), 4),
    }


def held_out(classifier: ShapeClassifier, count: int, vae_count: int, seed: int) -> dict[str, dict]:
    """Accuracies on fresh data-set seeds (``seed`` + 1 ...), never used in training, per kind of degradation."""
    generator = torch.Generator().manual_seed(seed)
    sets = {}
    for offset, kind in enumerate(("clean", "blurred", "noisy", "degraded", "vae")):
        rng = np.random.default_rng(seed + offset)
        images, captions = draw(vae_count if kind == "vae" else count, seed + 1 + offset, rng, blank=0.0)
        if kind == "blurred":
            images = gaussian_blur(images, uniform(len(images), 0.5, 1.5, generator))
        elif kind == "noisy":
            images = noise(images, torch.full((len(images),), 0.08), RESOLUTION, generator).clamp(0, 1)
        elif kind == "degraded":
            images = degrade(images, generator)
        elif kind == "vae":
            images = vae_round_trip(images, generator, latent_noise=0.3)
        sets[kind] = {**accuracies(classifier, images, captions), "seed": seed + 1 + offset}
    blanks = degrade(draw(count // 4, seed, np.random.default_rng(seed), blank=1.0)[0], generator)
    nothing = sum(shape == NOTHING for _, shape in classifier.read(blanks)) / len(blanks)
    sets["blank"] = {"images": len(blanks), "read_as_nothing": round(nothing, 4)}
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--blank", type=float, default=0.08, help="share of training images with nothing drawn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-images", type=int, default=2400)
    parser.add_argument("--eval-vae-images", type=int, default=960)
    parser.add_argument("--eval-seed", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("dit_trainer/assets/shape_classifier"))
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_flush_denormal(True)  # tiny gradients late in training are denormal floats, ~6x slower on a CPU
    rng, generator = np.random.default_rng(args.seed), torch.Generator().manual_seed(args.seed)
    colors, shapes = list(COLORS), [*SHAPES, NOTHING]
    net = ShapeClassifierNet(args.channels, len(colors), len(shapes))
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        images, captions = draw(args.batch_size, args.seed, rng, args.blank)
        color_target, shape_target = targets(captions, shapes)
        color_logits, shape_logits = net(degrade(images, generator))
        color_loss = F.cross_entropy(color_logits, color_target, ignore_index=IGNORE)
        loss = color_loss + F.cross_entropy(shape_logits, shape_target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == args.steps:
            print(f"step {step} loss {loss.item():.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    train_seconds = time.perf_counter() - start

    args.out.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in net.state_dict().items()}, args.out / WEIGHTS_NAME)
    config = {
        "architecture": "ShapeClassifierNet (dit_trainer/rewards/shape_classifier.py)",
        "channels": args.channels,
        "parameters": sum(p.numel() for p in net.parameters()),
        "colors": colors,
        "shapes": shapes,
        "resolution": RESOLUTION,
        "training": {
            "seed": args.seed,
            "steps": args.steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "blank": args.blank,
        },
    }
    (args.out / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    classifier = ShapeClassifier(args.out)  # the saved files are what is measured
    config["held_out"] = held_out(classifier, args.eval_images, args.eval_vae_images, args.eval_seed)
    (args.out / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    print(json.dumps(config["held_out"], indent=2))
    print(f"trained in {train_seconds:.0f} s, {time.perf_counter() - start:.0f} s in all; saved to {args.out}")


if __name__ == "__main__":
    main()
