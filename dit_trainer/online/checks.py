"""The checks every online method shares, of its section (a ``RolloutConfig``) and of what it needs of the rest: a
trained DiT to start from, prompts (class names or ids for a class-conditional model), updates that an epoch's
images can fill, and none of the settings that only data-set training has (DP-SGD, noise offset, validation
images, gradient accumulation)."""

from __future__ import annotations

from dit_trainer.components.class_labels import check_prompts_are_classes
from dit_trainer.config import TrainConfig
from dit_trainer.config.choices import CLASS_LABELS
from dit_trainer.config.online import RolloutConfig
from dit_trainer.errors import require
from dit_trainer.prompts import load_prompts


def check_online(cfg: TrainConfig, method: str, rollouts: RolloutConfig) -> None:
    """``rollouts``: the section of ``trainer.method=method``."""
    require(
        bool(cfg.trainer.init_from) or bool(cfg.model.pretrained),
        "trainer.init_from",
        cfg.trainer.init_from,
        f"`trainer.method={method}` fine-tunes a trained DiT, and neither a run to start from nor `model.pretrained` "
        "is set",
        "set `trainer.init_from=RUN_DIR` (a run train.py wrote) or `model.pretrained=<hub id or path>`",
    )
    prompts = load_prompts(rollouts.prompts, rollouts.prompt_file, f"{method}.")
    if cfg.text_encoder.kind == CLASS_LABELS:
        key = f"{method}.prompt_file" if rollouts.prompt_file else f"{method}.prompts"
        check_prompts_are_classes(cfg.text_encoder, key, prompts)
    images = rollouts.prompts_per_epoch * rollouts.group_size
    require(
        images >= rollouts.minibatches,
        f"{method}.minibatches",
        rollouts.minibatches,
        f"an epoch's {rollouts.prompts_per_epoch} x {rollouts.group_size} images per process cannot fill that many "
        "updates",
        f"set `{method}.minibatches={images}` or lower",
    )
    for key, value, unused in (
        ("diffusion.noise_offset", cfg.diffusion.noise_offset, "no data set's noise to offset"),
        ("validation.every_n_steps", cfg.validation.every_n_steps, "no data set to hold images out of"),
        ("privacy.enabled", cfg.privacy.enabled, "no data set whose examples DP-SGD would protect"),
    ):
        require(
            not value,
            key,
            value,
            f"`trainer.method={method}` trains on its own samples, with {unused}",
            f"set `{key}={'false' if isinstance(value, bool) else 0}`",
        )
    require(
        cfg.trainer.gradient_accumulation_steps == 1,
        "trainer.gradient_accumulation_steps",
        cfg.trainer.gradient_accumulation_steps,
        f"a `trainer.method={method}` update takes one minibatch of its images in one backward",
        f"set `trainer.gradient_accumulation_steps=1`; for less memory per update raise `{method}.minibatches`",
    )
