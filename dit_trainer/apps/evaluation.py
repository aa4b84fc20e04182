"""Judging a trained run: N prompts x G images scored with the run's rewards, plus what the data set's own judge
reads from the pixels (shapes: colour and shape accuracy); and FID / KID of samples against the run's validation
images."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, replace
from pathlib import Path

import torch

from dit_trainer.apps.inference import TrainedRun, check_sampling_args, load_run, new_file, refuse_overwrite
from dit_trainer.config import DataConfig, EvaluateConfig, MonitorConfig, RewardConfig, TrainerConfig
from dit_trainer.data import SOURCES
from dit_trainer.diffusion.sampler import SamplerSettings
from dit_trainer.errors import ConfigError
from dit_trainer.images import ANIMATION_FPS, clip_grids, image_grid, save_animation
from dit_trainer.prompts import load_prompts
from dit_trainer.rewards import REWARDS
from dit_trainer.rewards.build import build_reward, check_rewards_take
from dit_trainer.rewards.fid import (
    ReferenceSet,
    build_feature_extractor,
    check_reference_size,
    reference_cache_dir,
    require_feature_extractor,
    sample_count,
    sample_distances,
    small_sample_warning,
    validation_reference,
)
from dit_trainer.rewards.groups import reward_metrics
from dit_trainer.run_config import read_run_config
from dit_trainer.runs.run_folder import find_checkpoint

logger = logging.getLogger(__name__)
REPORT, GRID, CLIP_GRID = "report.json", "grid.png", "grid.gif"


def evaluation_prompts(
    cfg: EvaluateConfig, data: DataConfig, trainer: TrainerConfig, monitor: MonitorConfig
) -> list[str]:
    """The prompts given, else the run's reward-monitor prompts, else every caption of a data set with a closed set
    of them (shapes), else its sample prompts: by default a run is judged on what it was watched with."""
    if cfg.prompts or cfg.prompt_file:
        return load_prompts(cfg.prompts, cfg.prompt_file)
    watched = monitor.reward
    if watched.prompts or watched.prompt_file:
        return load_prompts(watched.prompts, watched.prompt_file, "monitor.reward.")
    captions = SOURCES.get(data.source).captions
    return captions() if captions is not None else list(trainer.sample_prompts)


def evaluation_reward(cfg: EvaluateConfig, run_reward: RewardConfig) -> RewardConfig:
    """The run's reward config, with the weights and CLIP model given on the command line taking precedence."""
    reward = replace(
        run_reward,
        weights=dict(cfg.weights or run_reward.weights),
        clip_model=cfg.clip_model or run_reward.clip_model,
    )
    if not reward.weights:
        raise ConfigError(
            "weights",
            {},
            "the run configures no reward function (its `reward.weights` is empty) and none was given",
            f"pass the rewards to score with, e.g. `weights.{next(iter(REWARDS))}=1.0` (names: {', '.join(REWARDS)})",
        )
    return reward


def reward_report(
    run: TrainedRun, cfg: EvaluateConfig, settings: SamplerSettings
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Sample ``images_per_prompt`` images per prompt (image j of each prompt with seed ``seed + j``) and score them.

    Returns the report, the images and their combined rewards.
    """
    prompts = evaluation_prompts(cfg, run.cfg.data, run.cfg.trainer, run.cfg.monitor)
    group = cfg.images_per_prompt
    all_prompts = [prompt for prompt in prompts for _ in range(group)]
    seeds = [cfg.seed + j for _ in prompts for j in range(group)]
    images = run.generate_images(all_prompts, seeds, settings, cfg.batch_size)
    reward_cfg = evaluation_reward(cfg, run.cfg.reward)
    reward = build_reward(reward_cfg, run.text_to_image.device)
    scores = reward.scores(images, all_prompts)
    rewards = reward.combine(scores).float().cpu()
    report = {
        "prompts": len(prompts),
        "images_per_prompt": group,
        "rewards": reward_cfg.weights,
        **reward_metrics(scores, rewards, group),
    }
    judge = SOURCES.get(run.cfg.data.source).judge
    if judge is not None:  # what the data set's own judge reads from the images (shapes: colour, shape)
        report |= judge(images, all_prompts)
    report["per_prompt"] = [
        {"prompt": prompt, "reward_mean": values.mean().item(), "rewards": values.tolist()}
        for prompt, values in zip(prompts, rewards.view(len(prompts), group))
    ]
    return report, images, rewards


def fid_reference(run: TrainedRun, cfg: EvaluateConfig) -> tuple[torch.nn.Module, ReferenceSet]:
    """The feature extractor and the run's validation images' features, refused when too few to compare: before
    any image is sampled."""
    device = run.text_to_image.device
    extractor = build_feature_extractor(cfg.fid_features, cfg.fid_weights, run.text_to_image.vae, run.cfg.vae, device)
    cache_dir = reference_cache_dir(cfg.fid_cache_dir, run.cfg.data, Path(cfg.run_dir).expanduser())
    reference = validation_reference(run.cfg.data, run.cfg.validation, extractor, cache_dir, device, cfg.batch_size)
    check_reference_size(
        reference,
        "metrics",
        list(cfg.metrics),
        "score this run with `metrics=[rewards]`, or train with more validation images",
    )
    warning = small_sample_warning(sample_count(reference, cfg.fid_images), reference)
    if warning:
        logger.warning(warning)
    return extractor, reference


def fid_report(
    run: TrainedRun, cfg: EvaluateConfig, settings: SamplerSettings, extractor: torch.nn.Module, reference: ReferenceSet
) -> dict:
    """FID and KID of ``fid_images`` samples against the run's validation images, with the counts they used."""

    def generate(prompts: list[str], seeds: list[int]) -> torch.Tensor:
        return run.generate_images(prompts, seeds, settings, cfg.batch_size)

    device = run.text_to_image.device
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
    fid = fid_reference(run, cfg) if "fid" in cfg.metrics else None
    images = rewards = None
    if "rewards" in cfg.metrics:
        scored, images, rewards = reward_report(run, cfg, settings)
        report |= scored
    if fid is not None:
        report |= fid_report(run, cfg, settings, *fid)
    return report, images, rewards


def evaluation_arguments(cfg: EvaluateConfig, checkpoint: Path) -> dict:
    """What decides an evaluation's numbers: its arguments, with the checkpoint resolved, less where it is written
    and how many images are sampled at once. A prompt file counts by its absolute path and the prompts it holds:
    another working directory's file of that name, or the file edited since, makes another evaluation."""
    arguments = {k: v for k, v in asdict(cfg).items() if k not in ("run_dir", "out_dir", "batch_size", "fid_cache_dir")}
    if cfg.prompt_file:
        prompt_file = Path(cfg.prompt_file).expanduser().absolute()
        arguments |= {"prompt_file": str(prompt_file), "prompts": load_prompts([], str(prompt_file))}
    return arguments | {"checkpoint": str(checkpoint.resolve())}


def evaluation_folder(cfg: EvaluateConfig, checkpoint: Path) -> Path:
    """``out_dir``, else ``RUN/eval/<checkpoint>-<metrics>-<digest of the arguments>``: evaluations with other seeds,
    prompts or metrics of one checkpoint each get their own folder."""
    if cfg.out_dir:
        return Path(cfg.out_dir).expanduser()
    text = json.dumps(evaluation_arguments(cfg, checkpoint), sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return Path(cfg.run_dir).expanduser() / "eval" / f"{checkpoint.name}-{'-'.join(cfg.metrics)}-{digest}"


def refuse_repeat(cfg: EvaluateConfig, out_dir: Path, names: list[str]) -> None:
    """The folder of an evaluation is checked before any model loads: an explicit ``out_dir`` must not hold the
    files it would write; the default one holding them means this very evaluation was run before."""
    if not cfg.out_dir and (out_dir / REPORT).exists():
        raise ConfigError(
            "out_dir",
            str(out_dir),
            "that default folder is this evaluation's (the same checkpoint and arguments), which was run before: "
            f"its report is {out_dir / REPORT}, and evaluate.py never overwrites",
            "read that report, or pass `out_dir=FOLDER` to evaluate again into another folder",
        )
    refuse_overwrite(out_dir, names, "evaluate.py")


def evaluate_to_folder(cfg: EvaluateConfig) -> tuple[Path, dict]:
    """Write ``report.json`` (with the arguments it was made with) and, with rewards, ``grid.png`` (one row per
    prompt, each image captioned with its reward). Nothing is replaced, and everything the arguments alone can
    tell (the folder, the checkpoint, the FID features) is checked before any model loads."""
    check_sampling_args(cfg)
    if "fid" in cfg.metrics:
        require_feature_extractor(cfg.fid_features, cfg.fid_weights, "fid_features", "fid_weights")
    run_dir = Path(cfg.run_dir).expanduser()
    run_cfg = read_run_config(run_dir)  # first: a folder that holds no run is named as such
    frames = run_cfg.data.frames
    if "rewards" in cfg.metrics:
        check_rewards_take(evaluation_reward(cfg, run_cfg.reward).weights, frames, prefix="weights")
    checkpoint = find_checkpoint(run_dir, cfg.checkpoint)
    out_dir = evaluation_folder(cfg, checkpoint)
    grid_name = CLIP_GRID if frames > 1 else GRID
    names = [REPORT, grid_name] if "rewards" in cfg.metrics else [REPORT]
    refuse_repeat(cfg, out_dir, names)
    run = load_run(cfg.run_dir, str(checkpoint), cfg.ema).at_size(cfg.height, cfg.width)
    report, images, rewards = evaluate(run, cfg)
    report["arguments"] = evaluation_arguments(cfg, checkpoint)
    out_dir.mkdir(parents=True, exist_ok=True)
    if images is not None:
        labels = [f"{value:.2f}" for value in rewards.tolist()]
        prompts = [entry["prompt"] for entry in report["per_prompt"]]
        with new_file(out_dir / grid_name, command="evaluate.py") as file:
            if images.ndim == 5:  # clips: an animated grid
                frames = clip_grids(images, cfg.images_per_prompt, labels=labels, row_labels=prompts)
                save_animation(frames, file, ANIMATION_FPS)
            else:
                image_grid(images, cfg.images_per_prompt, labels=labels, row_labels=prompts).save(file, format="PNG")
    with new_file(out_dir / REPORT, binary=False, command="evaluate.py") as file:  # last: a report ends a folder
        file.write(json.dumps(report, indent=2) + "\n")
    return out_dir, report
