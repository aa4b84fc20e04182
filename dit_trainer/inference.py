"""Loading a trained run back for sampling: the run's own config rebuilds the frozen components and schedule."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from omegaconf import OmegaConf
from PIL import Image

from dit_trainer.components import DiTAdapter
from dit_trainer.config import ConfigError, SampleConfig, TrainConfig, to_train_config
from dit_trainer.diffusion import NoiseSchedule, generate
from dit_trainer.training.checkpoint import EMA_DIR, TRANSFORMER_DIR, resolve_checkpoint
from dit_trainer.training.run import build_components


@dataclass
class TrainedRun:
    """Everything needed to generate images from one checkpoint of a run."""

    cfg: TrainConfig
    checkpoint: Path
    dit: DiTAdapter
    vae: torch.nn.Module
    text_encoder: torch.nn.Module
    schedule: NoiseSchedule
    device: torch.device

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        size = self.cfg.data.resolution // self.vae.downsample_factor
        return (self.vae.latent_channels, size, size)

    def generate_images(self, prompts: list[str], seeds: list[int], steps: int, guidance_scale: float) -> torch.Tensor:
        """Images (B, 3, H, W) in [0, 1]."""
        latents = generate(
            self.dit,
            self.schedule,
            self.text_encoder,
            prompts,
            seeds,
            self.latent_shape,
            steps,
            guidance_scale,
            self.device,
        )
        return (self.vae.decode(latents) + 1) / 2


def load_run(
    run_dir: str | Path, checkpoint: str = "latest", ema: bool = True, device: str | None = None
) -> TrainedRun:
    run_dir = Path(run_dir).expanduser()
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(
            "run_dir",
            str(run_dir),
            "it holds no config.yaml, so it is not a dit-trainer run folder",
            "pass the folder train.py wrote (its hydra.run.dir)",
        )
    cfg = to_train_config(OmegaConf.load(config_path))
    path = resolve_checkpoint(checkpoint, run_dir / "checkpoints")
    if path is None:
        raise ConfigError(
            "checkpoint",
            checkpoint,
            f"{run_dir}/checkpoints holds no checkpoint yet",
            "train longer, or pass `checkpoint=PATH`",
        )
    weights = path / EMA_DIR if ema and (path / EMA_DIR).is_dir() else path / TRANSFORMER_DIR
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    parts = build_components(
        replace(cfg, model=replace(cfg.model, pretrained=str(weights), subfolder=None)), device, dtype
    )
    return TrainedRun(
        cfg, path, parts.dit.to(device, dtype).eval(), parts.vae, parts.text_encoder, parts.schedule, device
    )


def read_prompts(cfg: SampleConfig) -> list[str]:
    if cfg.prompt_file:
        path = Path(cfg.prompt_file).expanduser()
        if not path.is_file():
            raise ConfigError(
                "prompt_file", cfg.prompt_file, "no such file", "pass a text file with one prompt per line"
            )
        prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        prompts = list(cfg.prompts)
    if not prompts:
        raise ConfigError(
            "prompt_file",
            cfg.prompt_file,
            "no prompts were given (the file is empty, or neither prompt_file nor prompts is set)",
            "pass `prompt_file=FILE` with one prompt per line",
        )
    return prompts


def sample_to_folder(cfg: SampleConfig) -> Path:
    """Write one PNG per image and ``index.jsonl`` (``{"file", "prompt", "seed"}`` per image) into ``out_dir``."""
    prompts = read_prompts(cfg)
    if cfg.images_per_prompt < 1:
        raise ConfigError("images_per_prompt", cfg.images_per_prompt, "it must be >= 1")
    run = load_run(cfg.run_dir, cfg.checkpoint, cfg.ema)
    steps = cfg.steps or run.cfg.diffusion.sample_steps
    guidance = run.cfg.diffusion.guidance_scale if cfg.guidance_scale is None else cfg.guidance_scale
    jobs = [
        (prompt, cfg.seed + index)
        for index, prompt in enumerate(p for p in prompts for _ in range(cfg.images_per_prompt))
    ]
    out_dir = Path(cfg.out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "index.jsonl").open("w", encoding="utf-8") as index_file:
        for start in range(0, len(jobs), cfg.batch_size):
            batch = jobs[start : start + cfg.batch_size]
            images = run.generate_images([p for p, _ in batch], [s for _, s in batch], steps, guidance)
            for offset, ((prompt, seed), image) in enumerate(zip(batch, images)):
                name = f"{start + offset:05d}.png"
                pixels = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
                Image.fromarray(pixels).save(out_dir / name)
                index_file.write(json.dumps({"file": name, "prompt": prompt, "seed": seed}) + "\n")
    return out_dir
