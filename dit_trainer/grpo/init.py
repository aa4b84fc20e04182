"""A GRPO run starts from a trained run: its model, VAE, text encoder, data and diffusion settings, and one
checkpoint's weights (EMA by default).

``inherit_init_run`` rewrites the config before it is validated (``run_config`` reads the init run's config and
calls it): the inherited sections are copied from the init run's config and ``model.pretrained`` points at the
checkpoint's weights folder, so the GRPO run is an ordinary fine-tuning run of a pretrained DiT. Its own
``config.yaml`` therefore records where it started (``grpo.init_weights``), and a resumed or requeued run keeps
that start whatever the init run has written since. A value set explicitly for an inherited key that differs from
the init run's is refused: the weights were trained with the init run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dit_trainer.config import TrainConfig
from dit_trainer.errors import ConfigError, shortlist
from dit_trainer.run_folder import CONFIG, find_checkpoint, is_checkpoint, weights_layout

INHERITED_SECTIONS = ("model", "vae", "text_encoder", "data", "diffusion")
# How a run samples and loads data, not what its weights learned: a GRPO run may set these.
FREE_KEYS = {
    "data.num_workers",
    "data.prefetch_factor",
    "diffusion.sampler",
    "diffusion.sample_steps",
    "diffusion.guidance_scale",
}


def init_checkpoint(init_from: str) -> tuple[Path, Path]:
    """(run folder, checkpoint) of ``grpo.init_from``: a run folder (its newest complete checkpoint) or one of
    its checkpoint folders."""
    path = Path(init_from).expanduser()
    if is_checkpoint(path):
        return path.parent.parent, path
    if not (path / CONFIG).is_file():
        raise ConfigError(
            "grpo.init_from",
            init_from,
            f"it is neither a run folder (one with a {CONFIG}) nor a checkpoint folder of one",
            "pass the folder train.py wrote (e.g. outputs/DATE/TIME) or one of its checkpoints/checkpoint-N folders",
        )
    return path, find_checkpoint(path, "latest")


def explicit_keys(overrides: Sequence[str]) -> list[str]:
    """The dotted keys Hydra command-line overrides set (``model=pixart_xl_2`` sets the whole ``model`` group)."""
    return [item.lstrip("+~").split("=", 1)[0] for item in overrides]


def _flatten(section: Any, prefix: str) -> dict[str, Any]:
    return {f"{prefix}.{name}": value for name, value in dataclasses.asdict(section).items()}


def _set_by_hand(cfg: TrainConfig, overrides: Sequence[str] | None) -> set[str]:
    """Inherited keys the user set: named on the command line, or (from Python, no command line) differing from
    the schema's defaults."""
    inherited = {key for name in INHERITED_SECTIONS for key in _flatten(getattr(cfg, name), name)}
    if overrides is None:
        defaults = TrainConfig()
        return {
            key
            for name in INHERITED_SECTIONS
            for key, value in _flatten(getattr(cfg, name), name).items()
            if _flatten(getattr(defaults, name), name)[key] != value
        }
    named = explicit_keys(overrides)
    return {key for key in inherited if any(key == n or key.startswith(f"{n}.") for n in named)}


def starting_weights(init: TrainConfig, init_from: str, run_dir: Path, checkpoint: Path, ema: bool) -> Path:
    """The weights folder of ``checkpoint`` (of the init run ``run_dir``, configured ``init``) a GRPO run starts
    from: its EMA weights when asked for and saved. A LoRA init run is refused: its adapter is not a whole model."""
    if init.lora.enabled:
        raise ConfigError(
            "grpo.init_from",
            init_from,
            "it is a LoRA run, whose adapter would have to be merged into its base first",
            f"export it (`python scripts/export.py run_dir={run_dir}` merges the adapter), then start the GRPO run "
            "from the export with `model.pretrained=EXPORT/transformer` and the run's other settings",
        )
    return weights_layout(False).weights_dir(checkpoint, ema).resolve()


def inherit_init_run(
    cfg: TrainConfig, init: TrainConfig, weights: Path, origin: str, overrides: Sequence[str] | None = None
) -> TrainConfig:
    """``cfg`` with the model, VAE, text encoder, data and diffusion settings of ``init`` (the config of the run
    ``grpo.init_from`` names, or the GRPO run's own as it recorded them) and ``model.pretrained`` at ``weights``;
    ``grpo.init_weights`` records ``origin``, the init checkpoint's weights folder. ``overrides`` are the command
    line's (None from Python: then values other than the schema's defaults count as set by hand)."""
    grpo = cfg.grpo
    inherited_model = dataclasses.replace(init.model, pretrained=str(weights), subfolder=None, revision=None)
    sections = {**{name: getattr(init, name) for name in INHERITED_SECTIONS}, "model": inherited_model}
    ours = {key: value for name in INHERITED_SECTIONS for key, value in _flatten(getattr(cfg, name), name).items()}
    theirs = {key: value for name, section in sections.items() for key, value in _flatten(section, name).items()}
    by_hand = _set_by_hand(cfg, overrides)
    conflicts = sorted(key for key in by_hand - FREE_KEYS if ours[key] != theirs[key])
    if conflicts:
        listed = shortlist([f"{key}={ours[key]!r} (the init run has {theirs[key]!r})" for key in conflicts], 4)
        raise ConfigError(
            "grpo.init_from",
            grpo.init_from,
            f"a GRPO run fine-tunes that run's weights with its model, VAE, text encoder, data and diffusion "
            f"settings, and these were set otherwise: {listed}",
            "remove those overrides (sampling settings `diffusion.sampler`, `diffusion.sample_steps` and "
            "`diffusion.guidance_scale` may differ), or start from another run",
        )
    for key in by_hand & FREE_KEYS:  # kept as set
        value = ours[key]
        name, field = key.split(".")
        sections[name] = dataclasses.replace(sections[name], **{field: value})
    return dataclasses.replace(cfg, **sections, grpo=dataclasses.replace(grpo, init_weights=origin))
