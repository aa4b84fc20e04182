"""A run folder: what ``train.py`` writes there and how other tools find it again.

Layout: ``config.yaml`` (the resolved config), ``metrics.jsonl``, ``checkpoints/checkpoint-N/`` (each complete one
with a ``manifest.json`` listing its files and sizes, the trained weights in one of the ``WeightsLayout``s),
``samples/``, ``rewards/`` and, for bucketed data read without a cache and without declared sizes, ``image_sizes/``
(the images' sizes index of ``dit_trainer.data.image_sizes``: their headers read once, by the main process, and not
again when the run resumes), and with ``logger=wandb`` ``wandb/`` and ``wandb_run_id`` (the W&B run a resume
continues). What is checked before a launch writes into the folder: ``check_writable_folder``, ``refuse_links``
and ``check_run_folder``, called by the Hydra callback of ``runs.launch_folder``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dit_trainer.durable import write_text_atomically
from dit_trainer.errors import ConfigError, shortlist

CONFIG = "config.yaml"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PATTERN = re.compile(r"checkpoint-(\d+)$")
MANIFEST = "manifest.json"
METRICS = "metrics.jsonl"  # one JSON object per logged step (``training.metrics.MetricsFile``)
KEPT = "kept.json"  # in checkpoints/: name -> the checkpoint kept from pruning under it (`best_gold`)
IMAGE_SIZES = "image_sizes"
# What a run writes once it has started: a folder holding any of these is never removed as a refused start's.
STARTED = (CONFIG, CHECKPOINTS, METRICS)
logger = logging.getLogger(__name__)  # not accelerate's: this module loads without torch


@dataclass(frozen=True)
class WeightsLayout:
    """Where a checkpoint keeps the trained weights: the raw ones in ``directory``, the EMA ones in
    ``ema_directory``; ``lora``: an adapter in peft's format rather than a whole transformer
    (``components.weights`` writes and reads them)."""

    directory: str
    ema_directory: str
    lora: bool

    def weights_dir(self, checkpoint: Path, ema: bool) -> Path:
        """The EMA weights if asked for and saved, else the raw ones."""
        return checkpoint / (
            self.ema_directory if ema and (checkpoint / self.ema_directory).is_dir() else self.directory
        )

    @property
    def what(self) -> str:
        """What the weights are, in messages."""
        return "LoRA adapters" if self.lora else "the whole DiT"


FULL_WEIGHTS = WeightsLayout("transformer", "transformer_ema", lora=False)
LORA_WEIGHTS = WeightsLayout("transformer_lora", "transformer_lora_ema", lora=True)


OWN_WEIGHTS = "init"  # RUN/init/<weights folder>: the weights a run started from another began with, its own copy


def same_own_weights(saved: str | None, current: str | None, run_dir: Path) -> bool:
    """Whether ``model.pretrained`` recorded as ``saved`` and now ``current`` are runs' own copies of one start
    (``RUN/init/<name>``): the same weights at another path. Either the checkpoint's run folder ``run_dir`` was
    moved or copied since, or the run continues in another folder, which made its own copy of ``run_dir``'s."""
    if saved is None or current is None:
        return False
    saved_path, current_path = Path(saved), Path(current)
    if {saved_path.parent.name, current_path.parent.name} != {OWN_WEIGHTS}:  # not both runs' own copies
        return False
    checkpoint_runs = run_dir.resolve() / OWN_WEIGHTS / saved_path.name
    if current_path == checkpoint_runs:
        return True
    from dit_trainer.hub import weights_fingerprint  # huggingface_hub: only when another run's copy is compared

    ours = weights_fingerprint(str(current_path), None, None)
    return ours is not None and ours == weights_fingerprint(str(checkpoint_runs), None, None)


def own_weights_moved(pretrained: object, run_dir: Path) -> str | None:
    """Where the run in ``run_dir``, moved or copied since it recorded its own copy of its starting weights as
    ``model.pretrained`` (``<its folder then>/init/<name>``), finds that copy now: in its ``init/``, when the recorded
    path is gone (None otherwise: nothing to find, or the recorded path still holds the weights)."""
    if not isinstance(pretrained, str):
        return None
    recorded, here = Path(pretrained), run_dir / OWN_WEIGHTS / Path(pretrained).name
    if recorded.parent.name != OWN_WEIGHTS or recorded.exists() or not here.is_dir():
        return None
    return str(here.resolve())


def weights_layout(lora: bool) -> WeightsLayout:
    return LORA_WEIGHTS if lora else FULL_WEIGHTS


def other_kind_only(checkpoint: Path, layout: WeightsLayout) -> WeightsLayout | None:
    """The other layout when ``checkpoint`` holds weights of that kind only (a LoRA run's checkpoint given for a run
    that trains the whole DiT, or the reverse), else None."""
    other = weights_layout(not layout.lora)
    held = (checkpoint / other.directory).is_dir() and not (checkpoint / layout.directory).is_dir()
    return other if held else None


def is_checkpoint(path: Path) -> bool:
    return any((path / fmt.directory).is_dir() for fmt in (FULL_WEIGHTS, LORA_WEIGHTS))


def checkpoint_step(path: Path) -> int:
    match = CHECKPOINT_PATTERN.search(path.name)
    if match is None:
        raise ValueError(f"{path} is not named checkpoint-<step>")
    return int(match.group(1))


def read_manifest(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / MANIFEST).read_text(encoding="utf-8"))


def incomplete_reason(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint (None when it is): no manifest, or a listed file missing or of
    another size than written."""
    if not (path / MANIFEST).is_file():
        return f"it has no {MANIFEST} (its write did not finish)"
    try:
        files = read_manifest(path)["files"]
    except (ValueError, KeyError):
        return f"its {MANIFEST} is unreadable"
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes where {size} were written (truncated or replaced)"
    return None


def _checkpoint_folders(checkpoints_dir: Path) -> list[Path]:
    if not checkpoints_dir.is_dir():
        return []
    found = [p for p in checkpoints_dir.iterdir() if p.is_dir() and CHECKPOINT_PATTERN.search(p.name)]
    return sorted(found, key=checkpoint_step)


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    return [p for p in _checkpoint_folders(checkpoints_dir) if incomplete_reason(p) is None]


def newest_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The newest complete checkpoint (None: there is none); a damaged newer one passed over is reported, so that
    nobody takes the older one for the newest."""
    found = list_checkpoints(checkpoints_dir)
    newest = checkpoint_step(found[-1]) if found else -1
    for path, reason in incomplete_checkpoints(checkpoints_dir).items():
        if checkpoint_step(path) > newest:
            logger.warning(f"{path} is passed over: it is not a complete checkpoint ({reason})")
    return found[-1] if found else None


def incomplete_checkpoints(checkpoints_dir: Path) -> dict[Path, str]:
    """The checkpoint folders that are not complete (a file deleted or damaged since: a write that did not finish
    is never named ``checkpoint-<step>``), each with why."""
    reasons = {p: incomplete_reason(p) for p in _checkpoint_folders(checkpoints_dir)}
    return {p: reason for p, reason in reasons.items() if reason is not None}


def check_run_folder(run_dir: Path, resume: str | None) -> None:
    """Refuse to write over another run's record: a fresh run over a folder's checkpoints (they would be mixed,
    then pruned) or over its metrics (the file would be cut to the new run's), and a checkpoint of another folder
    continued in a folder that holds a run."""
    existing = list_checkpoints(run_dir / CHECKPOINTS)
    metrics = run_dir / METRICS
    logged = metrics.is_file() and metrics.stat().st_size > 0
    if resume is None and existing:
        raise ConfigError(
            "trainer.resume",
            resume,
            f"the run folder {run_dir} already holds checkpoints (newest: {existing[-1].name}) and a fresh run "
            "would mix with them",
            "continue that run with `trainer.resume=latest`, or start a new one in a fresh `hydra.run.dir`",
        )
    if resume is None and logged:
        raise ConfigError(
            "trainer.resume",
            resume,
            f"the run folder {run_dir} holds the {METRICS} of an earlier run (its checkpoints are gone), which a "
            "fresh run would cut to its own",
            "start in a fresh `hydra.run.dir`, or move that file away first (`trainer.resume=latest` restarts the "
            "earlier run from step 0 and keeps what it logs)",
        )
    if resume in (None, "latest") or not (existing or logged):
        return
    if (run_dir / CHECKPOINTS).resolve() not in Path(resume).expanduser().resolve().parents:
        held = f"checkpoints up to {existing[-1].name}" if existing else f"the {METRICS} of a run"
        raise ConfigError(
            "trainer.resume",
            resume,
            f"it is a checkpoint of another folder, and the run folder {run_dir} already holds {held}, which "
            "continuing here would mix with and cut",
            "continue it in a fresh `hydra.run.dir`, or pass its run folder to continue that run where it is "
            "(`trainer.resume=RUN`)",
        )


def kept_checkpoints(checkpoints_dir: Path) -> dict[str, Path]:
    """The checkpoints kept from pruning by name (``{"best_gold": .../checkpoint-30}``): those of ``KEPT`` that are
    complete."""
    try:
        names = json.loads((checkpoints_dir / KEPT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    kept = {name: checkpoints_dir / folder for name, folder in names.items() if isinstance(folder, str)}
    return {name: path for name, path in kept.items() if path.is_dir() and incomplete_reason(path) is None}


def write_kept(checkpoints_dir: Path, kept: dict[str, int]) -> None:
    """``KEPT`` naming the checkpoint of each kept step (none written while nothing is kept)."""
    if kept or (checkpoints_dir / KEPT).exists():
        names = {name: f"checkpoint-{step}" for name, step in kept.items()}
        write_text_atomically(checkpoints_dir / KEPT, json.dumps(names, indent=1))


def resolve_checkpoint(spec: str | None, checkpoints_dir: Path) -> Path | None:
    """``latest`` -> the newest complete checkpoint in ``checkpoints_dir`` (None if there is none); a path -> that
    folder, refused unless it is a complete checkpoint (``trainer.resume``: training continues from all of it)."""
    if spec is None:
        return None
    if spec == "latest":
        found = list_checkpoints(checkpoints_dir)
        if not found:
            refuse_only_damaged(checkpoints_dir)
        return found[-1] if found else None
    path = Path(spec).expanduser()
    reason = incomplete_reason(path) if is_checkpoint(path) else None
    if not is_checkpoint(path) or reason:
        raise ConfigError(
            "trainer.resume",
            spec,
            f"it is not a complete checkpoint folder ({reason})"
            if reason
            else "it is not a checkpoint folder (one with a `transformer/` or `transformer_lora/` inside), nor a run "
            f"folder (one with a {CONFIG})",
            "pass a run folder to continue that run (`trainer.resume=outputs/DATE/TIME`), `trainer.resume=latest` "
            f"(the newest complete checkpoint in hydra.run.dir) or a folder such as {checkpoints_dir}/checkpoint-1000",
        )
    return path


def refuse_only_damaged(checkpoints_dir: Path) -> None:
    """``trainer.resume=latest`` finds no complete checkpoint: a run that wrote none starts from step 0, but one whose
    checkpoints are all damaged (a write that did not finish is never named ``checkpoint-<step>``) is refused; its
    fresh start would write over them, and they may hold intact weights."""
    damaged = incomplete_checkpoints(checkpoints_dir)
    if damaged:
        raise ConfigError(
            "trainer.resume",
            "latest",
            f"{checkpoints_dir} holds checkpoints, none of them complete ("
            + "; ".join(f"{path.name}: {reason}" for path, reason in damaged.items())
            + "), and starting again from step 0 would write over them",
            "restore a checkpoint folder from a copy, or start a fresh run in a new `hydra.run.dir`",
        )


def find_checkpoint(run_dir: Path, spec: str) -> Path:
    """``latest`` (the run's newest complete checkpoint; a damaged newer one passed over is reported), the name of
    one the run kept (``best_gold``: ``kept_checkpoints``), the name of one of its checkpoint folders
    (``checkpoint-20``) or the path of a checkpoint folder: complete, or written before checkpoints had a manifest
    (reading weights needs no more)."""
    checkpoints_dir = run_dir / CHECKPOINTS
    kept = kept_checkpoints(checkpoints_dir)
    if spec in kept:
        return kept[spec]
    if spec == "latest":
        newest = newest_checkpoint(checkpoints_dir)
        if newest is None:
            raise ConfigError(
                "checkpoint",
                spec,
                f"{checkpoints_dir} holds no complete checkpoint",
                "train longer (checkpoints are written every `trainer.checkpoint_every` steps and at the end), "
                "or pass `checkpoint=PATH`",
            )
        return newest
    path = Path(spec).expanduser()
    if not is_checkpoint(path) and is_checkpoint(checkpoints_dir / spec):
        path = checkpoints_dir / spec
    reason = incomplete_reason(path) if (path / MANIFEST).is_file() else None
    if reason is None and is_checkpoint(path):
        return path
    complete = list_checkpoints(checkpoints_dir)
    examples = "".join(f", `checkpoint={name}`" for name in [*kept, *[p.name for p in complete[-1:]]])
    raise ConfigError(
        "checkpoint",
        spec,
        f"it is not a complete checkpoint ({reason})"
        if reason
        else "it is neither a checkpoint folder (one with a `transformer/` or `transformer_lora/` inside), nor the "
        f"name of one in {checkpoints_dir}, nor of a checkpoint this run kept",
        f"use `checkpoint=latest`{examples} or the path of a checkpoint folder",
    )


def set_aside_newer(checkpoints_dir: Path, step: int) -> Path | None:
    """Move the checkpoints after ``step`` into ``abandoned-after-<step>/`` beside them (None when there are none):
    a run resumed from an older checkpoint starts a new branch, and the old branch's later checkpoints would
    otherwise be taken for ``latest``, and pruned before the new ones. They are kept, not deleted."""
    newer = [p for p in _checkpoint_folders(checkpoints_dir) if checkpoint_step(p) > step]
    if not newer:
        return None
    aside = checkpoints_dir / f"abandoned-after-{step}"
    number = 1
    while aside.exists():
        number += 1
        aside = checkpoints_dir / f"abandoned-after-{step}-{number}"
    aside.mkdir()
    for path in newer:
        path.rename(aside / path.name)
    return aside


def remove_unfinished_writes(checkpoints_dir: Path) -> None:
    """What writes that did not finish left (a kill, a failed process), at the start of a run, by the main process.
    A ``.partial`` folder is never a checkpoint: only disk space. A ``.replaced`` one is the previous copy of a
    checkpoint saved again (a run resumed from an older one): removed once the new ``checkpoint-N`` is complete, and
    renamed back when a kill between the two renames left it alone."""
    for leftover in checkpoints_dir.glob(".checkpoint-*.partial"):
        shutil.rmtree(leftover, ignore_errors=True)
    for replaced in checkpoints_dir.glob(".checkpoint-*.replaced"):
        path = checkpoints_dir / replaced.name.removeprefix(".").removesuffix(".replaced")
        if path.is_dir() and incomplete_reason(path) is None:
            shutil.rmtree(replaced, ignore_errors=True)
        elif not path.exists() and incomplete_reason(replaced) is None:
            replaced.rename(path)
            logger.warning(f"{path.name} was being saved again when the run stopped: its previous copy is restored")
        else:
            logger.warning(
                f"Neither {path.name} nor its previous copy {replaced.name} is complete ({incomplete_reason(path)}; "
                f"{incomplete_reason(replaced)}): both are left as they are, and neither is resumed from"
            )


def check_writable_folder(path: Path, key: str) -> None:
    """``path`` is, or can be created as, a folder this process may write into (nothing is created here)."""
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        reason = f"{existing} is a file, so no folder can be made inside it"
    elif not os.access(existing, os.W_OK | os.X_OK):
        reason = f"this process may not write into {existing} (read-only disk or permissions)"
    else:
        return
    raise unwritable(key, path, reason)


def unwritable(key: str, path: Path, reason: str) -> ConfigError:
    """The paragraph for a folder that ``key`` names and this process cannot write into, for ``reason``."""
    return ConfigError(key, str(path), reason, f"point `{key}` at a writable folder, e.g. `{key}=/scratch/runs/NAME`")


def refuse_links(run_dir: Path) -> None:
    """Refuse a run folder with links where the trainer writes: in the folder itself (``config.yaml``,
    ``metrics.jsonl``, ``train.log``, ``.lock``, ...) and in the folders it fills (``.hydra``, ``checkpoints``,
    ``samples``, ``rewards``, ``logs``, ``image_sizes``). Appending to ``metrics.jsonl`` or saving a sample grid
    through a link would change a file outside the run folder that someone else owns. (The W&B folder is W&B's,
    links and all.)"""
    if not run_dir.is_dir():
        return
    links = [path for path in run_dir.iterdir() if path.is_symlink()]
    for name in (".hydra", CHECKPOINTS, "samples", "rewards", "logs", IMAGE_SIZES):
        if (run_dir / name).is_dir() and not (run_dir / name).is_symlink():
            links += [path for path in (run_dir / name).iterdir() if path.is_symlink()]
    if links:
        listed = shortlist([f"{path.relative_to(run_dir)} -> {os.readlink(path)}" for path in sorted(links)], 3)
        raise ConfigError(
            "hydra.run.dir",
            str(run_dir),
            f"it holds links where the trainer writes ({listed}), and writing through them would change files "
            "outside the run folder",
            "remove those links (a run writes only into its own folder; to keep runs on another disk, point "
            "`hydra.run.dir` there), or start the run in a new folder",
        )
