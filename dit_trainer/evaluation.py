"""Judging a trained run: N prompts x G images scored with the run's rewards, plus colour and shape accuracy for
the shapes data (read from the pixels); and FID / KID of samples against the run's validation images."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from dit_trainer.config import EvaluateConfig, RewardConfig, TrainConfig, check_fields
from dit_trainer.data import SOURCES
from dit_trainer.data.shapes import CAPTIONS, alignment_components
from dit_trainer.data.split import unaugmented, validation_images
from dit_trainer.diffusion import SamplerSettings
from dit_trainer.errors import ConfigError
from dit_trainer.fid import (
    ReferenceSet,
    build_feature_extractor,
    cached_reference_set,
    distances,
    extract_features,
    reference_set,
)
from dit_trainer.images import image_grid
from dit_trainer.inference import TrainedRun, load_run
from dit_trainer.prompts import load_prompts
from dit_trainer.rewards import REWARDS, build_reward, reward_metrics


def evaluation_prompts(cfg: EvaluateConfig, run_cfg: TrainConfig) -> list[str]:
    """The prompts given, else the run's reward-monitor prompts, else (shapes) every caption, else its sample
    prompts: by default a run is judged on what it was watched with."""
    if cfg.prompts or cfg.prompt_file:
        return load_prompts(cfg.prompts, cfg.prompt_file)
    grpo = run_cfg.monitor.grpo
    if grpo.prompts or grpo.prompt_file:
        return load_prompts(grpo.prompts, grpo.prompt_file, "monitor.grpo.")
    if run_cfg.data.source == "shapes":
        return list(CAPTIONS)
    return list(run_cfg.trainer.sample_prompts)


def evaluation_reward(cfg: EvaluateConfig, run_cfg: TrainConfig) -> RewardConfig:
    """The run's reward config, with the weights and CLIP model given on the command line taking precedence."""
    reward = replace(
        run_cfg.reward,
        weights=dict(cfg.weights or run_cfg.reward.weights),
        clip_model=cfg.clip_model or run_cfg.reward.clip_model,
    )
    if not reward.weights:
        raise ConfigError(
            "weights",
            {},
            "the run configures no reward function (its `reward.weights` is empty) and none was given",
            f"pass the rewards to score with, e.g. `weights.{next(iter(REWARDS))}=1.0` (names: {', '.join(REWARDS)})",
        )
    return reward


def shapes_accuracy(images: torch.Tensor, prompts: list[str]) -> dict[str, float]:
    """Share of images showing the captioned colour, and the captioned shape."""
    color_ok, shape_ok = alignment_components(images, prompts)
    return {"color": color_ok.mean().item(), "shape": shape_ok.mean().item()}


def reward_report(
    run: TrainedRun, cfg: EvaluateConfig, settings: SamplerSettings
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Sample ``images_per_prompt`` images per prompt (image j of each prompt with seed ``seed + j``) and score them.

    Returns the report, the images and their combined rewards.
    """
    prompts = evaluation_prompts(cfg, run.cfg)
    group = cfg.images_per_prompt
    all_prompts = [prompt for prompt in prompts for _ in range(group)]
    seeds = [cfg.seed + j for _ in prompts for j in range(group)]
    images = run.generate_images(all_prompts, seeds, settings, cfg.batch_size)
    reward_cfg = evaluation_reward(cfg, run.cfg)
    reward = build_reward(reward_cfg, run.text_to_image.device)
    scores = reward.scores(images, all_prompts)
    rewards = reward.combine(scores).float().cpu()
    report = {
        "prompts": len(prompts),
        "images_per_prompt": group,
        "rewards": reward_cfg.weights,
        **reward_metrics(scores, rewards, group),
    }
    if run.cfg.data.source == "shapes":
        report |= shapes_accuracy(images, all_prompts)
    report["per_prompt"] = [
        {"prompt": prompt, "reward_mean": values.mean().item(), "rewards": values.tolist()}
        for prompt, values in zip(prompts, rewards.view(len(prompts), group))
    ]
    return report, images, rewards


def reference_fingerprint(run_cfg: TrainConfig, extractor: nn.Module) -> dict:
    """What the validation images' features depend on: the data, its content where a source can tell cheaply,
    the held-out selection, and the feature extractor."""
    data, validation = run_cfg.data, run_cfg.validation
    content = SOURCES[data.source].content
    fields = ("source", "path", "split", "image_column", "caption_column", "caption_columns", "resolution", "crop")
    return {
        "data": {name: getattr(data, name) for name in fields} | {"length": data.length, "seed": data.seed},
        "content": content(unaugmented(data, validation.path or data.path)) if content else None,
        "held_out": {"split": validation.split, "seed": validation.seed, "path": validation.path},
        "features": extractor.identity,
    }


def reference_cache_dir(cache_dir: str | None, run_cfg: TrainConfig) -> Path:
    """``cache_dir``, else the run's latent cache folder, else the user's cache folder."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if run_cfg.data.cache_dir:
        return Path(run_cfg.data.cache_dir).expanduser() / "fid_reference"
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "dit_trainer" / "fid_reference"


def validation_reference(
    run_cfg: TrainConfig, extractor: nn.Module, cache_dir: str | None, device: torch.device, batch_size: int
) -> ReferenceSet:
    """The features and captions of the run's validation images, computed once and cached."""
    held_out = validation_images(run_cfg.data, run_cfg.validation)
    if held_out is None:  # the config rules refuse a FID monitor without validation; evaluate.py checks here
        raise ConfigError(
            "metrics",
            ["fid"],
            "FID compares samples with the run's validation images, and this run holds none out (its "
            "`validation.every_n_steps` is 0)",
            "train with validation (`validation.every_n_steps=5000 validation.split=0.01`, or `validation.path=...`)",
        )
    return cached_reference_set(
        reference_cache_dir(cache_dir, run_cfg),
        reference_fingerprint(run_cfg, extractor),
        lambda: reference_set(held_out, extractor, device, batch_size),
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
    ``i``, cycled, with seed ``seed + i``) against the reference set."""
    count = count or len(reference.captions)
    prompts = [reference.captions[i % len(reference.captions)] for i in range(count)]
    images = generate(prompts, [seed + i for i in range(count)])
    samples = extract_features(extractor, images.split(batch_size), device)
    return {
        "fid_images": count,
        "fid_reference_images": len(reference.captions),
        **distances(reference.features, samples, seed),
    }


def fid_report(run: TrainedRun, cfg: EvaluateConfig, settings: SamplerSettings) -> dict:
    """FID and KID of ``fid_images`` samples against the run's validation images."""
    device = run.text_to_image.device
    extractor = build_feature_extractor(cfg.fid_features, cfg.fid_weights, run.text_to_image.vae, run.cfg.vae, device)
    reference = validation_reference(run.cfg, extractor, cfg.fid_cache_dir, device, cfg.batch_size)

    def generate(prompts: list[str], seeds: list[int]) -> torch.Tensor:
        return run.generate_images(prompts, seeds, settings, cfg.batch_size)

    scores = sample_distances(generate, reference, extractor, cfg.fid_images, cfg.seed, cfg.batch_size, device)
    return {"fid_features": cfg.fid_features, **scores}


def evaluate(run: TrainedRun, cfg: EvaluateConfig) -> tuple[dict, torch.Tensor | None, torch.Tensor | None]:
    """The report of ``cfg.metrics``; with ``rewards``, also the scored images and their combined rewards."""
    settings = run.settings(cfg.steps, cfg.guidance_scale, cfg.sampler)
    report = {
        "checkpoint": str(run.checkpoint),
        "ema": run.ema,  # what was loaded: a run without EMA weights is scored with its raw ones
        "sampler": settings.sampler,
        "steps": settings.steps,
        "guidance_scale": settings.guidance_scale,
        "size": list(run.text_to_image.image_size),
    }
    images = rewards = None
    if "rewards" in cfg.metrics:
        scored, images, rewards = reward_report(run, cfg, settings)
        report |= scored
    if "fid" in cfg.metrics:
        report |= fid_report(run, cfg, settings)
    return report, images, rewards


def evaluate_to_folder(cfg: EvaluateConfig) -> tuple[Path, dict]:
    """Write ``report.json`` and ``grid.png`` (one row per prompt, each image captioned with its reward)."""
    check_fields(cfg)
    run = load_run(cfg.run_dir, cfg.checkpoint, cfg.ema).at_size(cfg.height, cfg.width)
    out_dir = Path(cfg.out_dir).expanduser() if cfg.out_dir else Path(cfg.run_dir) / "eval" / run.checkpoint.name
    report, images, rewards = evaluate(run, cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if images is not None:
        labels = [f"{value:.2f}" for value in rewards.tolist()]
        prompts = [entry["prompt"] for entry in report["per_prompt"]]
        image_grid(images, cfg.images_per_prompt, labels=labels, row_labels=prompts).save(out_dir / "grid.png")
    return out_dir, report
