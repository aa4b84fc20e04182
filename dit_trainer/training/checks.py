"""The checks of what the training run itself is configured to do beyond the model and data: the weights a run
started from another begins with, DP-SGD (what would void its guarantee or fail inside Opacus) and the monitors
(their prompts, and FID's need for validation images)."""

from __future__ import annotations

from pathlib import Path

from dit_trainer.config import (
    DataConfig,
    ModelConfig,
    MonitorConfig,
    OptimConfig,
    PrivacyConfig,
    TrainerConfig,
    ValidationConfig,
)
from dit_trainer.data import SOURCES
from dit_trainer.errors import require
from dit_trainer.prompts import load_prompts
from dit_trainer.training.optimizers import check_optimizer


def check_training(
    model: ModelConfig,
    privacy: PrivacyConfig,
    data: DataConfig,
    optim: OptimConfig,
    trainer: TrainerConfig,
    monitor: MonitorConfig,
    validation: ValidationConfig,
) -> None:
    check_optimizer(optim)
    _check_checkpointing_options(trainer)
    if trainer.init_weights:
        _check_starting_weights(model, trainer)
    if privacy.enabled:
        _check_privacy(privacy, data, trainer)
    if monitor.reward.enabled:
        load_prompts(monitor.reward.prompts, monitor.reward.prompt_file, "monitor.reward.")
    if monitor.fid.enabled:
        _check_fid_monitor(data, monitor, validation)


def _check_checkpointing_options(trainer: TrainerConfig) -> None:
    """How blocks are recomputed means something only when they are: alone, the options recomputed nothing, silently
    (the README's selective checkpointing read as `gradient_checkpointing_every=2` by itself)."""
    for key, value, default in (("gradient_checkpointing_every", trainer.gradient_checkpointing_every, 1),
                                ("reentrant_checkpointing", trainer.reentrant_checkpointing, False)):  # fmt: skip
        require(
            trainer.gradient_checkpointing or value == default,
            f"trainer.{key}",
            value,
            "it says how blocks are recomputed, and `trainer.gradient_checkpointing` is false: none would be",
            f"add `trainer.gradient_checkpointing=true`, or drop `trainer.{key}`",
        )


def _check_starting_weights(model: ModelConfig, trainer: TrainerConfig) -> None:
    """A checkpoint's weights (or the run's own copy of them) are read as checkpoints are: safetensors only."""
    start = Path(str(model.pretrained))
    require(
        not start.is_dir() or any(start.glob("*.safetensors")),
        "trainer.init_from",
        trainer.init_from,
        f"the weights it starts from, {start}, hold no .safetensors file (train.py writes weights only as "
        "safetensors, and a pickled .bin found there is not loaded: unpickling can run code)",
        "start from a checkpoint train.py wrote (`trainer.init_from=RUN_DIR` takes its newest complete one)",
    )


def _check_privacy(privacy: PrivacyConfig, data: DataConfig, trainer: TrainerConfig) -> None:
    """The combinations that would void the DP guarantee or fail inside Opacus (a family adds its own)."""
    p, t = privacy, trainer
    require(
        (p.noise_multiplier is None) != (p.target_epsilon is None),
        "privacy.noise_multiplier/target_epsilon",
        (p.noise_multiplier, p.target_epsilon),
        "exactly one of them must be set (the noise, or the budget the noise is calibrated to)",
        "set e.g. `privacy.target_epsilon=8` and `privacy.noise_multiplier=null`",
    )
    require(
        t.gradient_accumulation_steps == 1,
        "trainer.gradient_accumulation_steps",
        t.gradient_accumulation_steps,
        "under `privacy.enabled=true` each optimizer step must see one Poisson-sampled batch (accumulating "
        "several would change the sampling rate the privacy accounting assumes)",
        f"set `trainer.gradient_accumulation_steps=1` and "
        f"`trainer.batch_size={t.batch_size * t.gradient_accumulation_steps}` (the expected batch size)",
    )
    require(
        not t.gradient_checkpointing,
        "trainer.gradient_checkpointing",
        t.gradient_checkpointing,
        "Opacus computes per-sample gradients from hooks that checkpointing's recomputation would run twice",
        "set `trainer.gradient_checkpointing=false` (lower `trainer.batch_size` if memory is short)",
    )
    require(
        not t.compile,
        "trainer.compile",
        t.compile,
        "Opacus' ghost clipping runs two backward passes through one graph, which a compiled block's backward "
        "refuses (it frees its buffers after the first), and the per-sample hooks of `privacy.mode=hooks` break "
        "the compiled blocks into a graph per layer (torch's recompile limit is hit and the step gets slower)",
        "set `trainer.compile=false` for DP-SGD",
    )
    require(
        t.mixed_precision != "fp16",
        "trainer.mixed_precision",
        t.mixed_precision,
        "fp16's loss scaling would scale the per-sample gradients that DP clips",
        "use `trainer.mixed_precision=bf16` (or `no`)",
    )
    require(
        not SOURCES.get(data.source).streamed or bool(data.cache_dir),
        "data.source",
        data.source,
        "DP needs Poisson sampling (each image drawn independently at every step), which a stream cannot do",
        "use a random-access source (`data=imagefolder` or `data=hf`) or a latent cache (`data.cache_dir`)",
    )


def _check_fid_monitor(data: DataConfig, monitor: MonitorConfig, validation: ValidationConfig) -> None:
    """The FID monitor compares samples with the validation images, read as images, through a feature extractor
    that must be available on this machine."""
    from dit_trainer.rewards.fid import (
        require_feature_extractor,  # torchmetrics: only for runs that monitor FID
    )

    f = monitor.fid
    require(
        bool(validation.every_n_steps),
        "monitor.fid.enabled",
        True,
        "the FID monitor compares samples with the validation images, and validation is off",
        "turn validation on (`validation.every_n_steps=5000 validation.split=0.01`, or `validation.path=...`)",
    )
    require(
        not (f.features == "vae" and data.cache_dir),
        "monitor.fid.features",
        "vae",
        "training from a latent cache (`data.cache_dir`) does not load the VAE encoder these features come from",
        "use `monitor.fid.features=inception`, or compute FID after training with `scripts/evaluate.py RUN "
        "metrics=[fid] fid_features=vae`",
    )
    require_feature_extractor(f.features, f.weights, "monitor.fid.features", "monitor.fid.weights")
