"""What a checkpoint says of itself in its ``manifest.json`` besides its files, and whether this launch may resume it.

A checkpoint records how it was written: ``launch`` (``single``: one process; ``ddp``: several, each with the whole
weights; ``fsdp``: FSDP2, each with a slice), ``world_size``, and ``lr_schedule_unit``: what its LR scheduler's
``last_epoch`` counts. It counts optimizer updates whatever the number of processes
(``training.optim.build_lr_scheduler``). A checkpoint without the key was written when accelerate stepped the
schedule once per process on each update (``last_epoch`` = updates x world size): its scheduler state is converted
when it is loaded, so it too resumes on any number of processes at the LR the uninterrupted run would have. A
checkpoint written before the manifest recorded its launch is known by its files: ``pytorch_model_fsdp_0/`` is
FSDP's.

The launch decides how accelerate reads the model and optimizer state: under FSDP as sharded
torch.distributed.checkpoint folders (``pytorch_model_fsdp_0/``, ``optimizer_0/``), otherwise as whole files
(``optimizer.bin``). A checkpoint of the other kind is refused before any model loads, in one paragraph that names
the launch that reads it: the checkpoint is intact, only the launch differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.logging import get_logger

from dit_trainer.components.lora import changed_base
from dit_trainer.config.recorded import relocated_paths, with_absolute_paths
from dit_trainer.config.renamed import move_renamed_keys_in_saved
from dit_trainer.errors import ConfigError
from dit_trainer.runs.run_folder import (
    FULL_WEIGHTS,
    WeightsLayout,
    checkpoint_step,
    other_kind_only,
    read_manifest,
    resolve_checkpoint,
    same_own_weights,
)
from dit_trainer.training.optimizers import check_resumed_optimizer
from dit_trainer.training.state.config_changes import config_changes, config_hash, defines_training

logger = get_logger(__name__)

SCHEDULE_IN_UPDATES = "optimizer_updates"
FSDP_MODEL_STATE = "pytorch_model_fsdp_0"  # accelerate's sharded model state (its optimizer's: optimizer_0)
FSDP_LAUNCH = "`accelerate launch --config_file accelerate_configs/fsdp.yaml train.py ...`"
UNSHARDED_LAUNCH = (
    "`python train.py ...` (one process) or a DDP launch such as `accelerate launch --config_file "
    "accelerate_configs/ddp_8gpu.yaml train.py ...` (any number of processes)"
)


@dataclass(frozen=True)
class WrittenBy:
    """How a checkpoint was written: ``launch`` (single, ddp or fsdp), by ``world_size`` processes, with its LR
    schedule counted in optimizer updates (``schedule_in_updates``) or in updates x world size."""

    launch: str
    world_size: int
    schedule_in_updates: bool

    @property
    def sharded(self) -> bool:
        return self.launch == "fsdp"


def launch_kind(accelerator: Accelerator) -> str:
    if accelerator.is_fsdp2:
        return "fsdp"
    return "ddp" if accelerator.num_processes > 1 else "single"


def how_written(accelerator: Accelerator) -> dict[str, Any]:
    """The manifest's record of this launch."""
    return {
        "launch": launch_kind(accelerator),
        "world_size": accelerator.num_processes,
        "lr_schedule_unit": SCHEDULE_IN_UPDATES,
    }


@dataclass(frozen=True)
class ResumeRules:
    """What a checkpoint must share with this run to be resumed: the kind of weights trained (``weights``), the
    model, data, objective, method and the ``method_sections`` it trains by in ``config`` (unless
    ``allow_config_change``), the number of processes where ``same_processes_because`` says why (each process then
    restores its own state), what the data hold (``data_content``) and, under LoRA, the frozen base the adapters
    train on (``base_weights``: ``hub.weights_fingerprint``); None: not compared."""

    weights: WeightsLayout = FULL_WEIGHTS
    config: dict[str, Any] = field(default_factory=dict)
    allow_config_change: bool = False
    same_processes_because: str | None = None
    method_sections: tuple[str, ...] = ()
    data_content: dict[str, Any] | None = None
    base_weights: str | None = None


def written_by(path: Path, manifest: dict[str, Any]) -> WrittenBy:
    """How checkpoint ``path`` was written; for one written before its manifest said so, what its files show."""
    world_size = manifest.get("world_size") or len(list(path.glob("trainer_state_*.safetensors")))
    launch = manifest.get("launch")
    if launch is None:
        launch = "fsdp" if (path / FSDP_MODEL_STATE).is_dir() else "ddp" if world_size > 1 else "single"
    return WrittenBy(launch, world_size, manifest.get("lr_schedule_unit") == SCHEDULE_IN_UPDATES)


def check_launch(path: Path, written: WrittenBy, accelerator: Accelerator) -> None:
    """Refuse a sharded checkpoint without FSDP, and a whole-weights one under FSDP: accelerate would look for
    files that kind of checkpoint does not have (the checkpoint is not damaged)."""
    sharded = accelerator.is_fsdp2
    if written.sharded == sharded:
        return
    by = f"{written.world_size} process{'es' if written.world_size > 1 else ''}"
    if written.sharded:
        accepted = (
            f"that checkpoint was written under FSDP by {by} (its model and optimizer state are sharded "
            f"torch.distributed.checkpoint folders, `{FSDP_MODEL_STATE}/` and `optimizer_0/`) and this run is not "
            "sharded, so it cannot read them; the checkpoint itself is intact"
        )
        fix = (
            f"resume it under FSDP, on any number of processes: {FSDP_LAUNCH} with the same overrides (on CPU "
            "processes `accelerate_configs/fsdp_cpu.yaml`), or start a fresh run in a new `hydra.run.dir`"
        )
    else:
        kind = "one process" if written.launch == "single" else f"DDP on {by}"
        accepted = (
            f"that checkpoint was written without FSDP ({kind}: its optimizer state is one `optimizer.bin`) and "
            "this run shards with FSDP, which reads only sharded checkpoints; the checkpoint itself is intact"
        )
        fix = (
            f"resume it without FSDP, with the same overrides: {UNSHARDED_LAUNCH}, or start a fresh run in a new "
            "`hydra.run.dir`"
        )
    raise ConfigError("trainer.resume", str(path), accepted, fix)


def check_resume_launch(checkpoints_dir: Path, spec: str | None, accelerator: Accelerator) -> None:
    """The launch check of the checkpoint ``trainer.resume`` picks, from its manifest alone: a run started right
    after the accelerator, before any model is built or loaded."""
    path = resolve_checkpoint(spec, checkpoints_dir)
    if path is not None:
        check_launch(path, written_by(path, read_manifest(path)), accelerator)


def check_resume_before_models(
    checkpoints_dir: Path, spec: str | None, rules: ResumeRules, accelerator: Accelerator, max_steps: int
) -> None:
    """Every check of the resume (``check_resumable``, ``refuse_resume_past_the_end``) on the checkpoint it tries
    first, before any model is built: a refused resume costs seconds, not the minutes that loading the models and
    encoding the data take. It warns of nothing: the resume itself does."""
    path = resolve_checkpoint(spec, checkpoints_dir)
    if path is not None:
        check_resumable(path, rules, accelerator, quiet=True)
        refuse_resume_past_the_end(path, checkpoint_step(path), max_steps)


def refuse_resume_past_the_end(path: Path, step: int, max_steps: int) -> None:
    """A run resumed at ``step`` (from ``path``) past ``trainer.max_steps`` would train nothing and record a run that
    ends earlier than its checkpoints."""
    if step > max_steps:
        raise ConfigError(
            "trainer.max_steps",
            max_steps,
            f"the run resumes at step {step} ({path.name}), past it: it would train nothing and record a run that "
            "ends earlier than its checkpoints",
            f"set `trainer.max_steps={step}` or more (to sample or export the run as it is, use scripts/sample.py or "
            "scripts/export.py)",
        )


def check_resumable(
    path: Path, rules: ResumeRules, accelerator: Accelerator, quiet: bool = False
) -> tuple[dict[str, Any], WrittenBy]:
    """Whether this run may resume checkpoint ``path`` under ``rules``: the kind of weights first (no
    ``allow_config_change`` makes the other kind load), then ``check_compatible`` and ``check_same_data``. Returns its
    manifest and how it was written. ``quiet``: warn of nothing (of changes allowed, another number of processes)."""
    manifest = read_manifest(path)
    written = written_by(path, manifest)
    check_weights_kind(path, rules.weights)
    check_compatible(path, manifest, written, accelerator, rules, quiet)
    check_same_data(path, manifest, rules, quiet)
    check_same_base(path, manifest, rules, quiet)
    return manifest, written


def check_weights_kind(path: Path, weights: WeightsLayout) -> None:
    """A LoRA checkpoint resumed as a full fine-tune, or the reverse: neither the weights nor the optimizer state of
    one can continue the other."""
    other = other_kind_only(path, weights)
    if other is None:
        return
    raise ConfigError(
        "trainer.resume",
        str(path),
        f"it holds {other.what} (`{other.directory}/`) and this run trains {weights.what} "
        f"(`lora.enabled={str(weights.lora).lower()}`): its weights and optimizer state cannot continue "
        "that kind of training",
        f"resume with `lora.enabled={str(other.lora).lower()}`, or start a fresh run in a new `hydra.run.dir` "
        "from its weights (`scripts/export.py` writes them as one diffusers transformer for `model.pretrained`)",
    )


def check_compatible(
    path: Path,
    manifest: dict[str, Any],
    written: WrittenBy,
    accelerator: Accelerator,
    rules: ResumeRules,
    quiet: bool = False,
) -> None:
    """Whether this run may resume checkpoint ``path`` (its ``manifest``, ``written`` so): a launch that reads it
    (``check_launch``), and the processes and config ``rules`` ask for; other changes (lr, monitors, ...) are
    listed in a warning unless ``quiet``."""
    check_launch(path, written, accelerator)
    config, same_processes_because = rules.config, rules.same_processes_because
    world_size, processes = written.world_size, accelerator.num_processes
    if world_size != processes and same_processes_because:
        raise ConfigError(
            "trainer.resume",
            str(path),
            f"it was written by {_processes(world_size)} and this run has {processes} ({same_processes_because})",
            f"resume with {world_size} processes (e.g. `accelerate launch --num_processes {world_size}`; CPU "
            "processes with `ACCELERATE_USE_CPU=1` and `--multi_gpu`), or "
            "start a fresh run in a new `hydra.run.dir`",
        )
    if world_size != processes and not quiet:
        logger.warning(
            f"Resuming {path.name}, written by {_processes(world_size)}, on {processes}: the weights, the optimizer "
            "state and the LR schedule continue exactly; each step now takes another number of images, and a "
            "shuffled data set continues in its epoch after the images already read (when the checkpoint records "
            "them: one written before it did continues after the steps' count of the new batches).",
            main_process_only=True,
        )
    if "config" not in manifest:  # written before checkpoints recorded their config
        if manifest.get("config_hash") != config_hash(config) and not quiet:
            logger.warning(f"The config differs from the one {path.name} was trained with; continuing with it.")
        return
    saved, _ = relocated_paths(move_renamed_keys_in_saved(manifest["config"]))  # a moved install: as the config's
    saved = with_absolute_paths(saved)  # relative paths recorded before they were made absolute
    pretrained = saved.get("model", {}).get("pretrained"), config["model"]["pretrained"]
    if same_own_weights(*pretrained, run_dir=path.parent.parent):  # the run folder was moved or copied
        saved = {**saved, "model": {**saved["model"], "pretrained": pretrained[1]}}
    changes = config_changes(saved, config)
    check_resumed_optimizer(path, saved, config)
    sections = rules.method_sections
    defining = [key for key, (old, new) in changes.items() if defines_training(key, old, new, sections)]
    warning = f"Resuming {path.name} with changed settings: " + ", ".join(
        f"{key} ({old!r} -> {new!r})" for key, (old, new) in changes.items()
    )
    if defining:
        refuse_unless_allowed(
            path,
            rules,
            quiet,
            "that checkpoint was trained with another model, data, data order (seed), held-out split, objective or "
            "reward fine-tuning: "
            + ", ".join(f"{key} ({changes[key][0]!r} -> {changes[key][1]!r})" for key in defining),
            "resume with the settings the run was trained with (its config.yaml), start a fresh run in a new "
            "`hydra.run.dir`",
            warning,
        )
    elif changes and not quiet:
        logger.warning(warning, main_process_only=True)


def _processes(count: int) -> str:
    return f"{count} process{'es' if count != 1 else ''}"


def check_same_data(path: Path, manifest: dict[str, Any], rules: ResumeRules, quiet: bool = False) -> None:
    """The data a checkpoint was trained on still hold what they held (``data_content``: a folder's metadata, a
    saved data set's fingerprint): images added or removed under the same config would move the held-out split
    (images trained on would be validated on) and the data order. A checkpoint that did not record it, or a run
    whose data cannot say it, is not compared."""
    saved, content = manifest.get("data_content"), rules.data_content
    if saved is None or content is None or saved == content:
        return
    refuse_unless_allowed(
        path,
        rules,
        quiet,
        f"the data it was trained on changed since (what they hold, under the same config: {saved} -> "
        f"{content}); images added or removed move the held-out split, so images trained on would be validated "
        "on, and the order of the data",
        "resume on the data as they were, start a fresh run in a new `hydra.run.dir` (`trainer.init_from=RUN` "
        "starts from its weights)",
        f"Resuming {path.name} on data that changed since it was written.",
    )


def check_same_base(path: Path, manifest: dict[str, Any], rules: ResumeRules, quiet: bool = False) -> None:
    """A LoRA checkpoint continues on the base its adapters trained on: the weights at ``model.pretrained`` replaced
    under the same path, or an unpinned hub id that moved on, would give the adapters another model to adapt."""
    if not changed_base(manifest.get("base_weights"), rules.base_weights):
        return
    pretrained = rules.config.get("model", {}).get("pretrained")
    refuse_unless_allowed(
        path,
        rules,
        quiet,
        f"its LoRA adapters were trained on other weights than those now at `model.pretrained={pretrained}` (their "
        f"files changed since: fingerprint {manifest['base_weights']} -> {rules.base_weights})",
        "put back the base the run trained on (for a hub id, pin the revision it had with `model.revision`), start a "
        "fresh run in a new `hydra.run.dir`",
        f"Resuming {path.name} on another base model at {pretrained}.",
    )


def refuse_unless_allowed(path: Path, rules: ResumeRules, quiet: bool, reason: str, fix: str, warning: str) -> None:
    """A checkpoint that trained on something else than this run would: refused in one paragraph (``reason``,
    ``fix``), or with ``trainer.allow_config_change`` resumed with a ``warning`` (none when ``quiet``)."""
    if not rules.allow_config_change:
        allow = "or, if the change is intended, add `trainer.allow_config_change=true`"
        raise ConfigError("trainer.resume", str(path), reason, f"{fix}, {allow}")
    if not quiet:
        logger.warning(warning, main_process_only=True)


def schedule_in_updates(state: dict[str, Any], written: WrittenBy) -> dict[str, Any]:
    """An LR scheduler's state counted in optimizer updates. One written when accelerate stepped the schedule once
    per process on each update counts updates x world size (``last_epoch``; ``_step_count`` counts one more, for
    the step the scheduler takes when built). The LR itself (``_last_lr``, and the optimizer's) is the same in both
    counts: every diffusers schedule is a function of the step over the warm-up and over the length, and both
    lengths were scaled by the world size too."""
    if written.schedule_in_updates:
        return state
    processes = max(written.world_size, 1)
    return {
        **state,
        "last_epoch": state["last_epoch"] // processes,
        "_step_count": 1 + (state["_step_count"] - 1) // processes,
    }
