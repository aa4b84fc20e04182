"""Judging a trained run: N prompts x G images scored with the run's rewards, plus colour and shape accuracy for
the shapes data (read from the pixels)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from dit_trainer.config import EvaluateConfig, RewardConfig, TrainConfig, check_fields
from dit_trainer.data.shapes import CAPTIONS, alignment_components
from dit_trainer.errors import ConfigError
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


def evaluate(run: TrainedRun, cfg: EvaluateConfig) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Sample ``images_per_prompt`` images per prompt (image j of each prompt with seed ``seed + j``) and score them.

    Returns the report, the images and their combined rewards.
    """
    prompts = evaluation_prompts(cfg, run.cfg)
    group = cfg.images_per_prompt
    all_prompts = [prompt for prompt in prompts for _ in range(group)]
    seeds = [cfg.seed + j for _ in prompts for j in range(group)]
    settings = run.settings(cfg.steps, cfg.guidance_scale, cfg.sampler)
    images = run.generate_images(all_prompts, seeds, settings, cfg.batch_size)
    reward_cfg = evaluation_reward(cfg, run.cfg)
    reward = build_reward(reward_cfg, run.text_to_image.device)
    scores = reward.scores(images, all_prompts)
    rewards = reward.combine(scores).float().cpu()
    report = {
        "checkpoint": str(run.checkpoint),
        "ema": run.ema,  # what was loaded: a run without EMA weights is scored with its raw ones
        "sampler": settings.sampler,
        "steps": settings.steps,
        "guidance_scale": settings.guidance_scale,
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


def evaluate_to_folder(cfg: EvaluateConfig) -> tuple[Path, dict]:
    """Write ``report.json`` and ``grid.png`` (one row per prompt, each image captioned with its reward)."""
    check_fields(cfg)
    run = load_run(cfg.run_dir, cfg.checkpoint, cfg.ema)
    out_dir = Path(cfg.out_dir).expanduser() if cfg.out_dir else Path(cfg.run_dir) / "eval" / run.checkpoint.name
    report, images, rewards = evaluate(run, cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    labels = [f"{value:.2f}" for value in rewards.tolist()]
    prompts = [entry["prompt"] for entry in report["per_prompt"]]
    image_grid(images, cfg.images_per_prompt, labels=labels, row_labels=prompts).save(out_dir / "grid.png")
    return out_dir, report
