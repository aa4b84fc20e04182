"""A run started from another (``trainer.init_from``, what the online methods do): its model, VAE, text encoder,
data and diffusion settings, and one checkpoint's weights (EMA by default).

``inherit_init_run`` rewrites the config before it is validated (``run_config`` reads the init run's config and
calls it): the inherited sections are copied from the init run's config and ``model.pretrained`` points at the
checkpoint's weights folder, so the new run is an ordinary fine-tuning run of a pretrained DiT. Its own
``config.yaml`` therefore records where it started (``trainer.init_weights``), and a resumed or requeued run keeps
that start whatever the init run has written since. A value set explicitly for an inherited key that differs from
the init run's is refused: the weights were trained with the init run's. A method that trains on the data set is
not started this way (its data would be the init run's): it starts from a checkpoint's weights folder in
``model.pretrained``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from dit_trainer.config import TrainConfig, register_resolvers
from dit_trainer.durable import link_or_copy_tree
from dit_trainer.errors import ConfigError, require, shortlist
from dit_trainer.runs.run_folder import (
    CHECKPOINTS,
    CONFIG,
    OWN_WEIGHTS,
    incomplete_checkpoints,
    is_checkpoint,
    newest_checkpoint,
    weights_layout,
)

if TYPE_CHECKING:
    from accelerate import Accelerator

INIT_FROM = "trainer.init_from"
INHERITED_SECTIONS = ("model", "vae", "conditioner", "data", "diffusion")
# How a run samples and loads data, not what its weights learned: a run started from another may set these.
FREE_KEYS = {
    "data.num_workers",
    "data.prefetch_factor",
    "diffusion.sampler",
    "diffusion.sample_steps",
    "diffusion.guidance_scale",
}


def init_checkpoint(init_from: str) -> tuple[Path, Path]:
    """(run folder, checkpoint) of ``trainer.init_from``: a run folder (its newest complete checkpoint) or one of
    its checkpoint folders."""
    path = Path(init_from).expanduser()
    if is_checkpoint(path) and (path.parent.parent / CONFIG).is_file():
        return path.parent.parent, path
    if is_checkpoint(path):
        raise ConfigError(
            INIT_FROM,
            init_from,
            f"it is a checkpoint folder outside a run folder (no {CONFIG} two levels up, which says how its weights "
            "were trained)",
            "pass the run folder it was written in, or a checkpoint inside one (`RUN/checkpoints/checkpoint-N`)",
        )
    if not (path / CONFIG).is_file():
        raise ConfigError(
            INIT_FROM,
            init_from,
            f"it is neither a run folder (one with a {CONFIG}) nor a checkpoint folder of one",
            "pass the folder train.py wrote (e.g. outputs/DATE/TIME) or one of its checkpoints/checkpoint-N folders",
        )
    checkpoints = path / CHECKPOINTS
    newest = newest_checkpoint(checkpoints)
    if newest is None:
        damaged = ", ".join(f"{folder.name}: {why}" for folder, why in incomplete_checkpoints(checkpoints).items())
        raise ConfigError(
            INIT_FROM,
            init_from,
            "the run folder holds no complete checkpoint to start from" + (f" ({damaged})" if damaged else ""),
            "pass a run that has written one (`trainer.checkpoint_every`; every run writes one at its end)",
        )
    return path, newest


def explicit_keys(overrides: Sequence[str]) -> list[str]:
    """The dotted keys Hydra command-line overrides set (``model=pixart_xl_2`` sets the whole ``model`` group)."""
    return [item.lstrip("+~").split("=", 1)[0] for item in overrides]


def _flatten(section: Any, prefix: str) -> dict[str, Any]:
    return {f"{prefix}.{name}": value for name, value in dataclasses.asdict(section).items()}


def _differs_from_defaults(cfg: TrainConfig) -> set[str]:
    """Inherited keys whose value is not the schema's default (resolved, as ``cfg``'s are: the default text encoder
    is a package's weights folder)."""
    register_resolvers()
    defaults = OmegaConf.to_object(OmegaConf.structured(TrainConfig))
    return {
        key
        for name in INHERITED_SECTIONS
        for key, value in _flatten(getattr(cfg, name), name).items()
        if _flatten(getattr(defaults, name), name)[key] != value
    }


def _set_by_hand(cfg: TrainConfig, overrides: Sequence[str] | None) -> set[str]:
    """Inherited keys the user set: named on the command line, or (from Python, no command line) differing from
    the schema's defaults."""
    inherited = {key for name in INHERITED_SECTIONS for key in _flatten(getattr(cfg, name), name)}
    if overrides is None:
        return _differs_from_defaults(cfg)
    named = explicit_keys(overrides)
    return {key for key in inherited if any(key == n or key.startswith(f"{n}.") for n in named)}


def starting_weights(init: TrainConfig, init_from: str, run_dir: Path, checkpoint: Path, ema: bool) -> Path:
    """The weights folder of ``checkpoint`` (of the init run ``run_dir``, configured ``init``) a run starts
    from: its EMA weights when asked for and saved. A LoRA init run is refused: its adapter is not a whole model."""
    if init.lora.enabled:
        raise ConfigError(
            INIT_FROM,
            init_from,
            "it is a LoRA run, whose adapter would have to be merged into its base first",
            f"export it (`python scripts/export.py run_dir={run_dir}` merges the adapter), then start the new run "
            "from the export with `model.pretrained=EXPORT/transformer` and the run's other settings",
        )
    return weights_layout(False).weights_dir(checkpoint, ema).resolve()


def inherit_init_run(
    cfg: TrainConfig, init: TrainConfig, weights: Path, origin: str, overrides: Sequence[str] | None = None
) -> TrainConfig:
    """``cfg`` with the model, VAE, text encoder, data and diffusion settings of ``init`` (the config of the run
    ``trainer.init_from`` names, or this run's own as it recorded them) and ``model.pretrained`` at ``weights``;
    ``trainer.init_weights`` records ``origin``, the init checkpoint's weights folder. ``overrides`` are the command
    line's (None from Python: then values other than the schema's defaults count as set by hand)."""
    inherited_model = dataclasses.replace(init.model, pretrained=str(weights), subfolder=None, revision=None)
    sections = {**{name: getattr(init, name) for name in INHERITED_SECTIONS}, "model": inherited_model}
    ours = {key: value for name in INHERITED_SECTIONS for key, value in _flatten(getattr(cfg, name), name).items()}
    theirs = {key: value for name, section in sections.items() for key, value in _flatten(section, name).items()}
    by_hand = _set_by_hand(cfg, overrides)
    conflicts = sorted(key for key in by_hand - FREE_KEYS if ours[key] != theirs[key])
    if conflicts:
        listed = shortlist([f"{key}={ours[key]!r} (the init run has {theirs[key]!r})" for key in conflicts], 4)
        raise ConfigError(
            INIT_FROM,
            cfg.trainer.init_from,
            f"a run started from another fine-tunes that run's weights with its model, VAE, text encoder, data and "
            f"diffusion settings, and these were set otherwise: {listed}",
            "remove those overrides (sampling settings `diffusion.sampler`, `diffusion.sample_steps` and "
            "`diffusion.guidance_scale` may differ), or start from another run",
        )
    # Kept as set: by hand, or by the recipe (a value other than the schema's default: `shapes_nft` samples
    # without CFG whatever its init run did).
    for key in (by_hand | _differs_from_defaults(cfg)) & FREE_KEYS:
        value = ours[key]
        name, field = key.split(".")
        sections[name] = dataclasses.replace(sections[name], **{field: value})
    return dataclasses.replace(cfg, **sections, trainer=dataclasses.replace(cfg.trainer, init_weights=origin))


def check_init_from(cfg: TrainConfig, reads_data: bool) -> None:
    """Refuse ``trainer.init_from`` for a method that trains on the data set, whose data would be the init run's."""
    require(
        not (cfg.trainer.init_from and reads_data),
        INIT_FROM,
        cfg.trainer.init_from,
        f"`trainer.method={cfg.trainer.method}` trains on a data set, and a run started from another takes that "
        "run's data settings with its weights",
        "continue that run with `trainer.resume=RUN`, or start from its weights with this run's own data: "
        "`model.pretrained=RUN/checkpoints/checkpoint-N/transformer_ema` (or `transformer`)",
    )


def own_starting_weights(cfg: TrainConfig, run_dir: Path, accelerator: Accelerator) -> TrainConfig:
    """``cfg`` with ``model.pretrained`` at the run's own copy of the weights it starts from (hard links where the
    file system allows): its samples, exports, resumes and reference policy never depend on the init run's
    checkpoint, which that run may prune. The main process makes the copy; the others wait for it."""
    source = Path(str(cfg.model.pretrained))
    own = run_dir / OWN_WEIGHTS / source.name
    if source != own.resolve():
        if accelerator.is_main_process and not own.is_dir():
            own.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy_tree(source, own)
        accelerator.wait_for_everyone()
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pretrained=str(own.resolve())))
