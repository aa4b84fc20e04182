"""The evaluation sections: the held-out loss (``validation``) and the periodic monitors (``monitor``: the reward
of samples, FID and KID). What each measures and logs is in its docstring; ``training/`` builds them."""

from __future__ import annotations

from dataclasses import dataclass, field

from dit_trainer.config.choices import FID_FEATURES
from dit_trainer.config.fields import at_least, fraction, one_of
from dit_trainer.config.grpo import GRPOMonitorConfig


@dataclass
class ValidationConfig:
    """The loss on held-out images, comparable across steps and runs: a fixed image set, each image at the same
    ``timesteps`` stratified noise levels with the same noise (seeded per image), the posterior's mode, no caption
    dropout, the EMA weights, on the main process. Logs val/loss (the unweighted MSE to the objective's target),
    val/loss/t_<timestep> per stratum and val/seconds. The held-out images are never trained on."""

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
class MonitorConfig:
    grpo: GRPOMonitorConfig = field(default_factory=GRPOMonitorConfig)
    fid: FIDMonitorConfig = field(default_factory=FIDMonitorConfig)
