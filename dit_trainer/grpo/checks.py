"""The ``grpo`` section's checks: a trained starting point, prompts, a window of trained steps inside the sampler,
and updates that an epoch's trajectories can fill."""

from __future__ import annotations

from dit_trainer.components.class_labels import check_prompts_are_classes
from dit_trainer.config import TrainConfig
from dit_trainer.config.choices import CLASS_LABELS
from dit_trainer.errors import require
from dit_trainer.prompts import load_prompts


def check_grpo(cfg: TrainConfig) -> None:
    g = cfg.grpo
    require(
        bool(cfg.trainer.init_from) or bool(cfg.model.pretrained),
        "trainer.init_from",
        cfg.trainer.init_from,
        "GRPO fine-tunes a trained DiT, and neither a run to start from nor `model.pretrained` is set",
        "set `trainer.init_from=RUN_DIR` (a run train.py wrote) or `model.pretrained=<hub id or path>`",
    )
    require(
        not cfg.diffusion.noise_offset,
        "diffusion.noise_offset",
        cfg.diffusion.noise_offset,
        "a GRPO run trains on the log-probabilities of its own samples, with no training noise to offset",
        "set `diffusion.noise_offset=0`",
    )
    require(
        not cfg.validation.every_n_steps,
        "validation.every_n_steps",
        cfg.validation.every_n_steps,
        "a GRPO run trains on its own samples and reads no data set to hold images out of",
        "set `validation.every_n_steps=0`",
    )
    prompts = load_prompts(g.prompts, g.prompt_file, "grpo.")
    if cfg.text_encoder.kind == CLASS_LABELS:
        check_prompts_are_classes(cfg.text_encoder, "grpo.prompt_file" if g.prompt_file else "grpo.prompts", prompts)
    window_end = g.sde_start + (g.sde_steps or 1)
    require(
        window_end < g.sample_steps,
        "grpo.sde_start/sde_steps",
        (g.sde_start, g.sde_steps),
        f"the trained steps must lie within the first {g.sample_steps - 1} of the `grpo.sample_steps="
        f"{g.sample_steps}` sampler steps (the last step is deterministic)",
        "lower `grpo.sde_start` or `grpo.sde_steps`, or raise `grpo.sample_steps`",
    )
    window_size = g.sde_steps or g.sample_steps - 1 - g.sde_start
    require(
        g.steps_per_trajectory is None or g.steps_per_trajectory <= window_size,
        "grpo.steps_per_trajectory",
        g.steps_per_trajectory,
        f"a trajectory has only {window_size} trained steps (the `grpo.sde_start`/`sde_steps` window) to draw from",
        f"set `grpo.steps_per_trajectory={window_size}` or lower, or null for all of them",
    )
    require(
        g.prompts_per_epoch * g.group_size >= g.minibatches,
        "grpo.minibatches",
        g.minibatches,
        f"an epoch's {g.prompts_per_epoch} x {g.group_size} trajectories per process cannot fill that many updates",
        f"set `grpo.minibatches={g.prompts_per_epoch * g.group_size}` or lower",
    )
    require(
        not cfg.privacy.enabled,
        "privacy.enabled",
        True,
        "GRPO trains on generated images, not on the data set, so DP-SGD's per-example guarantee has nothing to "
        "protect there",
        "set `privacy.enabled=false`",
    )
    require(
        cfg.trainer.gradient_accumulation_steps == 1,
        "trainer.gradient_accumulation_steps",
        cfg.trainer.gradient_accumulation_steps,
        "a GRPO update takes one minibatch of trajectories (all its trained steps in one backward)",
        "set `trainer.gradient_accumulation_steps=1`; for less memory per update raise `grpo.minibatches`",
    )
