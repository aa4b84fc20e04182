"""The one loader of training configs, above every part of the package: what ``train.py``, the scripts and the
tests call to turn a composed Hydra config (or a ``TrainConfig`` built in Python) into a validated ``TrainConfig``,
and to read a run folder's config back.

The order keeps mistakes cheap: the schema's field checks first (no torch, no model, no folder read), keys that
moved read from their old place (``config.renamed``), then a run started from another inherits its init run's
settings, a class-conditional run its class folders, every name a registry holds is looked up (still without
torch), and only then does each part of the package check its own sections (``components``, ``diffusion``,
``data`` when the method reads data, ``training``, the method's own, ``rewards``), importing what those checks need.
Defaults that depend on a registry entry (LoRA's target modules) are recorded last, so that the saved config says
what was trained.

``trainer.resume=RUN`` (a run folder, or a checkpoint folder in one) continues that run (``continue_run``): before
Hydra composes, the run's recorded ``config.yaml`` takes the schema's place as the base every option and override is
composed onto, ``hydra.run.dir`` becomes the run folder (the same on every process of a launch: it comes from the
command line, not from a clock), and ``trainer.resume`` the checkpoint to continue from. Only the overrides given now
change the recorded config, and the checkpoint's own check lists each change (and refuses one of what is trained
without ``trainer.allow_config_change=true``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dit_trainer.components import CONDITIONER_KINDS, VAE_KINDS
from dit_trainer.components.families import FAMILIES
from dit_trainer.config import TrainConfig, call_with_sections, check_fields, register_configs
from dit_trainer.config.choices import CLASS_LABELS
from dit_trainer.config.command_line import parsed_overrides
from dit_trainer.config.recorded import (
    refuse_interpolations,
    relocated_paths,
    report_relocated,
    with_absolute_paths,
)
from dit_trainer.config.renamed import move_renamed_keys, move_renamed_sections_in_saved
from dit_trainer.config.resolvers import check_package_model, register_resolvers
from dit_trainer.data import SOURCES
from dit_trainer.diffusion import OBJECTIVES, SAMPLERS
from dit_trainer.errors import ConfigError
from dit_trainer.methods import METHODS, method_of
from dit_trainer.rewards import REWARDS
from dit_trainer.runs.init_run import check_init_from, inherit_init_run, init_checkpoint, starting_weights
from dit_trainer.runs.run_folder import CHECKPOINTS, CONFIG, is_checkpoint, list_checkpoints, own_weights_moved

RESUME = "trainer.resume"
MULTIRUN_FLAGS = ("-m", "--multirun")


def compose_train_config(config_dir: Path, overrides: list[str]) -> TrainConfig:
    """The validated config ``train.py`` would build from ``overrides``, composed with Hydra's compose API (no
    output folder is made)."""
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=overrides), overrides)


def to_train_config(
    cfg: DictConfig | TrainConfig, overrides: Sequence[str] | None = None, run_dir: Path | None = None
) -> TrainConfig:
    """A composed Hydra config (or a ``TrainConfig`` built in Python) as validated dataclasses, interpolations
    such as ``${asset:shapes_vae}`` resolved. ``trainer.init_from`` is applied here, once (a run's saved config
    records it in ``trainer.init_weights``); ``overrides`` are the command line's, to tell which values were set by
    hand; ``run_dir`` is the folder the run trains in, whose recorded start a run started from another keeps."""
    register_resolvers()
    structured = OmegaConf.to_object(typed_by_schema(cfg))
    structured = move_renamed_keys(structured)  # before the field checks: a moved value is checked at its new key
    check_fields(structured)
    structured = with_absolute_local_paths(structured)
    METHODS.check(structured.trainer.method)
    if structured.trainer.init_from and structured.trainer.init_weights is None:
        check_init_from(structured, method_of(structured.trainer).reads_data)
        structured = start_from_run(structured, overrides, run_dir)
    check_package_model(str(structured.conditioner.pretrained))
    return with_tracker_names(with_lora_targets(validate(with_class_folders(structured))), overrides)


def with_absolute_local_paths(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with its relative paths of local models and prompt files made absolute
    (``config.recorded.with_absolute_paths``): the saved config then serves a resume, ``sample.py`` or ``export.py``
    from any working directory."""
    return _with_values(cfg, with_absolute_paths(dataclasses.asdict(cfg)))


def _with_values(node: Any, values: dict[str, Any]) -> Any:
    """The dataclass ``node`` with the text (or unset) fields whose value in ``values`` (``asdict(node)``, edited)
    differs replaced, in nested dataclasses too; ``node`` itself when none does."""
    changed = {}
    for spec in dataclasses.fields(node):
        value, wanted = getattr(node, spec.name), values[spec.name]
        if dataclasses.is_dataclass(value):
            if (replaced := _with_values(value, wanted)) is not value:
                changed[spec.name] = replaced
        elif (value is None or isinstance(value, str)) and wanted != value:
            changed[spec.name] = wanted
    return dataclasses.replace(node, **changed) if changed else node


def typed_by_schema(cfg: DictConfig | TrainConfig) -> DictConfig:
    """``cfg`` as a config of the schema's types. One Hydra composed onto the schema (``train_schema``) is one
    already; any other (a run's saved YAML, a ``TrainConfig`` built in Python) is merged onto the schema, which
    checks each value's type. Merging a composed one again would cost a tenth of a second and change nothing."""
    if isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is TrainConfig:
        return cfg
    return OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)


def start_from_run(cfg: TrainConfig, overrides: Sequence[str] | None, run_dir: Path | None) -> TrainConfig:
    """``cfg`` inheriting its init run. A run folder that already recorded its start (a resumed or requeued run)
    keeps it, whatever the init run has written (or pruned) since: the weights it started from are its own copy."""
    recorded = recorded_start(cfg, run_dir)
    if recorded is not None:
        weights = Path(str(recorded.model.pretrained))
        return inherit_init_run(cfg, recorded, weights, str(recorded.trainer.init_weights), overrides)
    init_dir, checkpoint = init_checkpoint(cfg.trainer.init_from)
    init = read_run_config(init_dir)
    weights = starting_weights(init, cfg.trainer.init_from, init_dir, checkpoint, cfg.trainer.init_ema)
    return inherit_init_run(cfg, init, weights, str(weights), overrides)


def recorded_start(cfg: TrainConfig, run_dir: Path | None) -> TrainConfig | None:
    """The config ``run_dir`` recorded when this run (the same ``trainer.init_from``) started there, or None."""
    if run_dir is None or not (run_dir / CONFIG).is_file():
        return None
    recorded = read_run_config(run_dir)
    t = recorded.trainer
    same = t.method == cfg.trainer.method and t.init_from == cfg.trainer.init_from and t.init_weights
    return recorded if same else None


def with_lora_targets(cfg: TrainConfig) -> TrainConfig:
    """An empty ``lora.target_modules`` is the family's own targets, recorded in the run's saved config: a resume
    or an export later adapts the same modules, whatever the family's defaults have become by then."""
    if cfg.lora.target_modules:
        return cfg
    from dit_trainer.components.families import FAMILIES

    targets = list(FAMILIES.get(cfg.model.family).lora_targets)
    return dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, target_modules=targets))


def with_tracker_names(cfg: TrainConfig, overrides: Sequence[str] | None) -> TrainConfig:
    """An unset ``logger.group`` and empty ``logger.tags`` are the experiment's name (``+experiment=NAME`` among
    ``overrides``), recorded in the run's saved config: the W&B runs of one recipe group together."""
    pairs = (item.lstrip("+").partition("=") for item in overrides or ())
    names = [value for key, _, value in pairs if key == "experiment"]
    if not names or not names[-1] or (cfg.logger.group and cfg.logger.tags):
        return cfg
    group, tags = cfg.logger.group or names[-1], list(cfg.logger.tags) or [names[-1]]
    return dataclasses.replace(cfg, logger=dataclasses.replace(cfg.logger, group=group, tags=tags))


def with_class_folders(cfg: TrainConfig) -> TrainConfig:
    """A class-conditional run on an image folder of class sub-folders, with ``conditioner.classes`` unset, gets
    the sub-folder names (sorted, as torchvision numbers them), recorded in its saved config: sampling and export
    later read the classes there, with no data at hand."""
    text, data = cfg.conditioner, cfg.data
    if text.kind != CLASS_LABELS or text.classes or data.source != "imagefolder" or not data.path:
        return cfg
    from dit_trainer.data.sources.imagefolder import METADATA
    from dit_trainer.images import class_folders

    folder = Path(data.path).expanduser()
    if not folder.is_dir() or (folder / METADATA).is_file():
        return cfg
    return dataclasses.replace(cfg, conditioner=dataclasses.replace(text, classes=class_folders(folder)))


def check_names(cfg: TrainConfig) -> None:
    """Every name that picks an implementation, against its registry: a typo is answered with the accepted names
    before any implementation (or torch) is imported."""
    for registry, name in (
        (FAMILIES, cfg.model.family),
        (VAE_KINDS, cfg.vae.kind),
        (CONDITIONER_KINDS, cfg.conditioner.kind),
        (SOURCES, cfg.data.source),
        (OBJECTIVES, cfg.diffusion.objective),
        (SAMPLERS, cfg.diffusion.sampler),
    ):
        registry.check(name)
    for position, entry in enumerate(cfg.data.mixture):
        SOURCES.check(entry.source, f"data.mixture[{position}].source")
    for name in cfg.reward.weights:
        REWARDS.check(name, f"reward.weights.{name}")


def validate(cfg: TrainConfig) -> TrainConfig:
    """The field checks, the names, then each part's checks of its own sections; the first failure is one
    ``ConfigError`` paragraph naming the key, the value, what is accepted and the fix. Returns ``cfg``."""
    check_fields(cfg)
    check_names(cfg)
    # The parts' checks import torch and the model libraries: only once the fields are known to be good.
    from dit_trainer.components.checks import check_components
    from dit_trainer.components.geometry import check_bucket_sizes
    from dit_trainer.data.checks import check_data
    from dit_trainer.diffusion.checks import check_diffusion
    from dit_trainer.rewards.build import check_rewards
    from dit_trainer.training.checks import check_training

    method = method_of(cfg.trainer)
    check_components(cfg)
    call_with_sections(check_diffusion, cfg)
    if method.reads_data:
        call_with_sections(check_data, cfg)
        call_with_sections(
            check_bucket_sizes, cfg
        )  # the models' patch grid: after the data's own checks of its buckets
    call_with_sections(check_training, cfg)
    check_unread_sections(cfg)
    for check in method.checks():
        method.ask(check, cfg)
    call_with_sections(check_rewards, cfg, method_scores=method.scores_rewards)
    return cfg


def check_unread_sections(cfg: TrainConfig) -> None:
    """Refuse settings of a method other than the run's: its section would be ignored without a word."""
    for name in METHODS:
        other = METHODS.get(name)
        if other.section is None or name == cfg.trainer.method:
            continue
        section, defaults = getattr(cfg, other.section), type(getattr(cfg, other.section))()
        changed = [f.name for f in dataclasses.fields(section) if getattr(section, f.name) != getattr(defaults, f.name)]
        if changed:
            key = f"{other.section}.{changed[0]}"
            raise ConfigError(
                key,
                getattr(section, changed[0]),
                f"it is a setting of `trainer.method={name}`, and this run trains with `trainer.method="
                f"{cfg.trainer.method}`, which reads no `{other.section}.*`",
                f"set `trainer.method={name}`, or drop the `{other.section}.*` settings (an override, or the config "
                "of the run this one continues: a resumed run keeps its method)",
            )


def saved_config(run_dir: Path) -> DictConfig:
    """A run folder's ``config.yaml`` on the schema (typed, not yet checked); interpolations in it are refused,
    never resolved, and a key this version does not accept is one paragraph."""
    config_path = run_dir / CONFIG
    if not config_path.is_file():
        raise ConfigError(
            "run_dir",
            str(run_dir),
            f"it holds no {CONFIG}, so it is not a dit-trainer run folder",
            "pass the folder train.py wrote (its hydra.run.dir)",
        )
    try:
        saved = OmegaConf.load(config_path)
    except (yaml.YAMLError, OmegaConfBaseException) as error:  # a hand edit that broke the file
        raise ConfigError(
            "run_dir",
            str(run_dir),
            f"its {CONFIG} is not a YAML mapping ({' '.join(str(error).split())})",
            f"fix {config_path} (train.py wrote it; `python train.py --cfg job` prints a valid config)",
        ) from None
    refuse_interpolations(saved, config_path)
    drop_unread_sections(saved)
    if isinstance(saved, DictConfig):  # (not a mapping: the merge below says so in one paragraph)
        tree, moved = relocated_paths(move_renamed_sections_in_saved(OmegaConf.to_container(saved)))
        model = tree.get("model")
        own = own_weights_moved(model.get("pretrained"), run_dir) if isinstance(model, dict) else None
        if own is not None:  # the run folder was moved since: its own copy of the weights it started from
            moved[model["pretrained"]], model["pretrained"] = own, own
        report_relocated(moved, config_path)
        saved = OmegaConf.create(tree)
    try:
        return OmegaConf.merge(OmegaConf.structured(TrainConfig), saved)
    except OmegaConfBaseException as error:  # a setting renamed, removed or retyped since the run was trained
        key, reason = error.full_key or CONFIG, str(error).partition("\n")[0]
        raise ConfigError(
            key,
            OmegaConf.select(saved, error.full_key, default=None) if error.full_key else None,
            f"this version of dit-trainer does not accept it in {config_path} ({reason}; "
            "the file was written by another version, or edited)",
            f"edit that key in {config_path} to the current setting (`python train.py --cfg job` prints them "
            "all) or remove it, then run again",
        ) from None


def drop_unread_sections(saved: DictConfig) -> None:
    """Remove from a saved config the sections of methods the run did not train with: they hold the defaults of the
    version that wrote them, which today's defaults may have changed, and no step of the run read them."""
    if not isinstance(saved, DictConfig):  # not a mapping: the merge with the schema says so in one paragraph
        return
    trainer, grpo = saved.get("trainer"), saved.get("grpo")  # either may be anything a hand edit left
    method = trainer.get("method") if isinstance(trainer, DictConfig) else None
    if not method:  # written before trainer.method
        method = "grpo" if isinstance(grpo, DictConfig) and grpo.get("enabled") is True else "sft"
    for name in METHODS:
        section = METHODS.get(name).section
        if section is not None and name != method:
            saved.pop(section, None)


def read_run_config(run_dir: Path) -> TrainConfig:
    """The validated config a run folder was trained with; interpolations in it are refused, never resolved."""
    return to_train_config(saved_config(run_dir))


@dataclasses.dataclass(frozen=True)
class Continuation:
    """What ``trainer.resume=RUN`` continues: the run folder, the checkpoint (None: the run's newest), whether the
    run trains on in its own folder (else in ``hydra.run.dir``, from that checkpoint), and the command line Hydra
    gets instead (``overrides``: the user's others)."""

    run_dir: Path
    checkpoint: Path | None
    in_place: bool
    argv: list[str]
    overrides: list[str]


def hydra_quoted(text: str) -> str:
    """``text`` as one quoted value of a Hydra override (a path with spaces, commas or brackets stays one string;
    Hydra unescapes only the backslashes before a quote and at the end)."""
    body = re.sub(r"(\\*)'", lambda match: match.group(1) * 2 + "\\'", text)
    return "'" + re.sub(r"(\\+)$", lambda match: match.group(1) * 2, body) + "'"


def run_of(path: Path) -> tuple[Path, Path | None] | None:
    """The run folder ``path`` is, or the run folder of the checkpoint ``path`` is with that checkpoint; None for
    anything else (``latest``, a checkpoint outside a run folder: ``trainer.resume`` as before)."""
    if (path / CONFIG).is_file():
        return path, None
    if path.parent.name == CHECKPOINTS and is_checkpoint(path) and (path.parent.parent / CONFIG).is_file():
        return path.parent.parent, path
    return None


def recorded_keys_set(argv: list[str], recorded: DictConfig) -> list[str]:
    """``argv`` with each ``+key=value`` whose key the recorded config already holds as ``++key=value`` (set, whether
    there or not): the run was started with that key added, so the command line that started it, given again with
    ``trainer.resume``, composes onto its record instead of failing as an addition of a key that is there."""
    missing = object()
    present = {
        item
        for item, override in parsed_overrides(argv)
        if override is not None
        and override.is_add()
        and OmegaConf.select(recorded, override.key_or_group, default=missing) is not missing
    }
    return [f"+{item}" if item in present else item for item in argv]


def continue_run(argv: list[str]) -> Continuation | None:
    """``train.py``'s command line when ``trainer.resume`` names a run folder or a checkpoint in one (None
    otherwise): that run's recorded config becomes the base Hydra composes onto (registered in the schema's place,
    with ``trainer.allow_config_change`` back to false: a permission is given per launch), and the run trains on
    in its folder (``hydra.run.dir``, whose ``.hydra/`` record of how the run started is kept), or, when another
    ``hydra.run.dir`` is given or under ``-m``, in that one from the checkpoint."""
    value, run_dir_given = None, None
    for _, override in parsed_overrides(argv):
        if override is None:
            continue  # the pre-check or Hydra answers it
        if override.key_or_group == RESUME and isinstance(override.value(), str):
            value = override.value()
        elif override.key_or_group == "hydra.run.dir" and isinstance(override.value(), str):
            run_dir_given = Path(override.value()).expanduser()
    run = run_of(Path(value).expanduser()) if value else None
    if run is None:
        return None
    run_dir, checkpoint = run
    in_place = not any(flag in argv for flag in MULTIRUN_FLAGS) and (
        run_dir_given is None or run_dir_given.resolve() == run_dir.resolve()
    )
    if not in_place and checkpoint is None:
        complete = list_checkpoints(run_dir / CHECKPOINTS)
        if not complete:
            raise ConfigError(
                RESUME,
                value,
                f"that run holds no complete checkpoint to start this run (in {run_dir_given or 'a sweep folder'}) "
                "from",
                "continue it in its own folder (leave `hydra.run.dir` out), or pass a checkpoint folder",
            )
        checkpoint = complete[-1]
    base = saved_config(run_dir)
    base.trainer.allow_config_change = False
    ConfigStore.instance().store(name="train_schema", node=base)
    replaced = (RESUME, "hydra.run.dir") if in_place else (RESUME,)
    rest = recorded_keys_set([item for item in argv if item.partition("=")[0].lstrip("+~") not in replaced], base)
    resume = f"{RESUME}={'latest' if checkpoint is None else hydra_quoted(str(checkpoint))}"
    place = [f"hydra.run.dir={hydra_quoted(str(run_dir))}", "hydra.output_subdir=null"] if in_place else []
    overrides = [item for item in rest if "=" in item and not item.startswith("-")]
    # Hydra's flags (`--cfg job`, `-m`) after the overrides, as typed: argparse takes its overrides in one run
    flag = next((index for index, item in enumerate(rest) if item.startswith("-")), len(rest))
    return Continuation(run_dir, checkpoint, in_place, [*rest[:flag], resume, *place, *rest[flag:]], overrides)
