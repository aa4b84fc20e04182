"""The evaluation sections: the held-out loss (``validation``) and the periodic monitors (``monitor``: the reward
of samples in groups, ``monitor.reward``, and FID and KID, ``monitor.fid``). What each measures and logs is in its
docstring; ``training/`` builds them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dit_trainer.config.choices import FID_FEATURES
from dit_trainer.config.fields import at_least, fraction, one_of, positive


@dataclass
class ValidationConfig:
    """The loss on held-out images, comparable across steps and runs: a fixed image set, each image at the same
    ``timesteps`` stratified noise levels with the same noise (seeded per image), the posterior's mode, no caption
    dropout, the EMA weights, on the main process. Logs val/loss (the unweighted MSE to the objective's target),
    val/loss/t_<timestep> per stratum and val/seconds. The held-out images are never trained on."""

    # Which images are held out: changed at a resume, images already trained on would become validation images.
    DEFINING: ClassVar[frozenset[str]] = frozenset({"split", "seed", "path"})

    # 0 disables validation (and holds nothing out); it also runs at the last step
    every_n_steps: int = at_least(0, 0, note="0 disables validation")
    # The fraction of the data set held out (a seeded choice of items), or 0 when `path` holds the validation data.
    split: float = fraction(0.0, note="0 holds nothing out")
    path: str | None = None  # held-out data of the same `data.source` kind (an image folder, a dataset, shards)
    timesteps: int = at_least(1, 8)  # strata of the noise range, one fixed timestep at each centre
    batch_size: int = at_least(1, 64)
    seed: int = 0  # the noise of held-out image i is drawn from seed + i


@dataclass
class FIDMonitorConfig:
    """Periodic FID and KID of samples from the EMA weights against the validation images (so it needs
    `validation`): sample i for validation caption i (cycled) with seed `seed + i`, on the main process. Logs
    fid/fid, fid/kid_mean, fid/images (the samples it used: FIDs of different counts differ) and fid/seconds."""

    enabled: bool = False
    every_n_steps: int = at_least(1, 5000)  # also runs at the last step
    num_images: int | None = at_least(2, None, note="null: one per validation image")
    # inception: the standard features (needs torch-fidelity); vae: the run's own VAE encoder (offline)
    features: str = one_of(FID_FEATURES, "inception")
    weights: str | None = None  # a local copy of torch-fidelity's Inception weights file, for offline machines
    # where the validation images' features are cached: null is data.cache_dir/fid_reference, else RUN/fid_reference
    cache_dir: str | None = None
    seed: int = 0
    batch_size: int = at_least(1, 32)  # images sampled at once


@dataclass
class RewardMonitorConfig:
    """Periodic reward monitoring, of any run (``monitor.reward``): ``prompts`` x ``group_size`` images with fixed
    seeds, sampled with the EMA weights under no_grad on the main process and scored by ``reward``, in groups as
    GRPO forms them. Logs reward/mean, reward/std, reward/<name>, grpo/adv_abs_mean, grpo/zero_std_frac and
    monitor/seconds; writes RUN/rewards/step_N.png."""

    enabled: bool = False
    every_n_steps: int = at_least(1, 1000)  # also runs at the last step
    prompts: list[str] = field(default_factory=list)
    prompt_file: str | None = None  # one prompt per line; used instead of `prompts` when set
    group_size: int = at_least(  # G: images per prompt
        2, 4, "set e.g. `{key}=4`", "GRPO's group statistics, a per-prompt mean and std, need at least 2 images"
    )
    seed: int = 0  # image j of every prompt uses seed + j, so groups are comparable across prompts and runs
    sample_steps: int | None = at_least(1, None, note="or null for diffusion.sample_steps")
    guidance_scale: float | None = at_least(0, None, "set e.g. `{key}=3.0`", "or null for diffusion.guidance_scale")
    batch_size: int = at_least(1, 32)  # images sampled at once
    # advantages are (r - mean) / (std + eps)
    eps: float = positive(1e-4, note="it keeps advantages finite for zero-std groups")


@dataclass
class RenamedRewardMonitor:
    """``monitor.grpo``, the earlier name of ``monitor.reward``: what is set here (null: nothing) is moved there with a
    warning (``config/renamed.py``), so that command lines, recipes and run folders of before the rename still work.
    Its fields are ``RewardMonitorConfig``'s."""

    enabled: bool | None = None
    every_n_steps: int | None = None
    prompts: list[str] | None = None
    prompt_file: str | None = None
    group_size: int | None = None
    seed: int | None = None
    sample_steps: int | None = None
    guidance_scale: float | None = None
    batch_size: int | None = None
    eps: float | None = None


@dataclass
class MonitorConfig:
    reward: RewardMonitorConfig = field(default_factory=RewardMonitorConfig)
    fid: FIDMonitorConfig = field(default_factory=FIDMonitorConfig)
    grpo: RenamedRewardMonitor = field(default_factory=RenamedRewardMonitor)  # the earlier name of `monitor.reward`
