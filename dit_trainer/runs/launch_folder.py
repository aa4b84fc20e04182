"""A launch's run folder: checked before Hydra makes it or writes into it, and left as the launch found it when the
start is refused. An unwritable or impossible path (a full or read-only disk, a file where a folder should be), links
planted where the trainer writes, a folder another run is training in, or a start that would write over another
run's record become one paragraph naming ``hydra.run.dir`` instead of a traceback from Hydra or a write outside the
run folder (``RunFolderCheck``); after a refusal, a folder Hydra made for the start is removed again, and in a folder
that was there Hydra's record of its run's launch is put back as it was, and a job log (``train.log``) it did not hold
is removed (``discard_refused_start``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from dit_trainer.durable import write_atomically
from dit_trainer.errors import EXIT_BAD_INPUT, ConfigError, exit_code
from dit_trainer.runs.run_folder import (
    CHECKPOINTS,
    METRICS,
    STARTED,
    check_run_folder,
    check_writable_folder,
    refuse_links,
    unwritable,
)
from dit_trainer.runs.run_lock import RunFolderLock, hold_for_run, release_held

Trained = tuple[tuple[int, int] | None, list[str]]  # metrics.jsonl's size and time of change, the checkpoints' names
HYDRA_RECORD = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes into `hydra.output_subdir`

# Run folders (absolute) that did not exist when this process's launch checked them, each with the topmost of its
# folders that did not exist either (``outputs/`` on a first run): what a refused start removes again.
_made_by_this_launch: dict[Path, Path] = {}
# Run folders (absolute) that existed when this process's launch checked them, with the folder of Hydra's record of
# how their run was launched (``.hydra/``), its files' contents before this launch wrote its own (None: there was no
# such folder; a file's None: no such file) and what the run had trained (``_trained``): what a refusal puts back,
# unless this launch trained.
_records_before_this_launch: dict[Path, tuple[Path, dict[str, bytes | None] | None, Trained]] = {}
# Run folders (absolute) that existed without Hydra's log of the job (``train.log``) when this process's launch checked
# them, with that log's path: the log a refusal removes again, unless this launch trained.
_logs_made_by_this_launch: dict[Path, tuple[Path, Trained]] = {}


class RunFolderCheck(Callback):
    """Hydra callback (``hydra.callbacks`` in ``configs/train.yaml``) that runs before Hydra makes the run folder
    and writes into it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Also refuses links where the trainer writes, a folder another run is training in (the main process
        only: the others would find the main process's lock), and a start that would write over another run's
        record (``check_run_folder``), before Hydra writes its files there."""
        # As Hydra makes it: `runs/x/../a` is `runs/a`, whether or not `runs/x` exists (the kernel would say that
        # `runs/x/../a` does not exist when `runs/x` does not, and a refusal would remove `runs/a` as made by it).
        run_dir = Path(os.path.normpath(config.hydra.run.dir))
        existed = run_dir.exists()
        if not existed:
            top = absolute(run_dir)
            while not top.parent.exists():
                top = top.parent
            _made_by_this_launch[absolute(run_dir)] = top
        try:
            check_writable_folder(run_dir, "hydra.run.dir")
            refuse_links(run_dir)
            if os.environ.get("RANK", "0") == "0":
                hold_for_run(run_dir)  # held from here: a second launch is refused before Hydra writes anything
            check_run_folder(run_dir, OmegaConf.select(config, "trainer.resume"))  # before Hydra's .hydra/ record
            if existed:  # read once the folder is known to hold no links
                _remember_record(run_dir, OmegaConf.select(config, "hydra.output_subdir"))
                job = OmegaConf.select(config, "hydra.job.name")
                log = run_dir / f"{job}.log"  # Hydra's job log, opened before the config is read
                if job and not log.exists():
                    _logs_made_by_this_launch[absolute(run_dir)] = log, _trained(run_dir)
        except OSError as error:  # where permissions do not tell (a root-squashed NFS share, /proc): making it failed
            release_held(run_dir)
            reason = f"the folder could not be made there ({error.strerror or error})"
            print(f"error: {unwritable('hydra.run.dir', run_dir, reason)}", file=sys.stderr)
            sys.exit(EXIT_BAD_INPUT)
        except ConfigError as error:
            release_held(run_dir)  # (a process that launches again, as tests do, must find the folder free)
            print(f"error: {error}", file=sys.stderr)
            sys.exit(exit_code(error))


def discard_refused_start(run_dir: Path) -> None:
    """Remove ``run_dir`` again after a start was refused, if this launch made it (``RunFolderCheck``) and no run
    has started in it, with the empty folders made for it (``outputs/DATE``): a refused start leaves nothing behind.
    A folder that existed before (a refused resume) is left as it was, Hydra's record of its launch included (the
    main process puts back what this launch wrote over, and removes the job log it added to a folder that had
    none). So is the folder of a multi-process launch: it holds each process's failure record, which the others and
    the job script read (``dit_trainer.runs.failures``). Unless the launch trained before it stopped (a second
    Ctrl-C, a data error at a later epoch): then its record and log stay."""
    release_held(run_dir)  # not taken over by a run: the launch was refused before it started
    record, files, trained = _records_before_this_launch.pop(absolute(run_dir), (None, None, None))
    if record is not None and trained == _trained(run_dir) and os.environ.get("RANK", "0") == "0":
        _put_back(record, files)
    log, trained = _logs_made_by_this_launch.pop(absolute(run_dir), (None, None))
    if log is not None and trained == _trained(run_dir) and os.environ.get("RANK", "0") == "0":
        log.unlink(missing_ok=True)
    top = _made_by_this_launch.pop(absolute(run_dir), None)
    if top is None or int(os.environ.get("WORLD_SIZE", "1")) > 1 or not run_dir.is_dir():
        return
    if any((run_dir / name).exists() for name in STARTED):
        return
    try:
        with RunFolderLock(run_dir):  # a run that started there since (a pinned folder) holds it: leave it be
            shutil.rmtree(run_dir)
    except ConfigError:
        return
    for folder in absolute(run_dir).parents:
        if not folder.is_relative_to(top):
            break
        try:
            folder.rmdir()  # only if empty: another launch's folder may have appeared beside this one
        except OSError:
            break


def absolute(run_dir: Path) -> Path:
    """``run_dir`` as Hydra makes it (``os.path.abspath``: ``runs/x/../a`` is ``runs/a``), the key of the records
    above."""
    return Path(os.path.abspath(run_dir))


def _remember_record(run_dir: Path, subdir: str | None) -> None:
    """Keep Hydra's record of the launch of the run in ``run_dir`` (its ``HYDRA_RECORD`` files in ``subdir``; None:
    Hydra writes none) as it is before this launch writes its own, for a refusal to put back. A record this process
    cannot read is left as it is."""
    record = run_dir / subdir if subdir else None
    if record is None or record.parent != run_dir:  # none, or the run folder itself (`hydra.output_subdir=.`)
        return
    try:
        files = {name: _read(record / name) for name in HYDRA_RECORD} if record.is_dir() else None
    except OSError:
        return
    _records_before_this_launch[absolute(run_dir)] = record, files, _trained(run_dir)


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _trained(run_dir: Path) -> Trained:
    """What the run in ``run_dir`` has trained, as far as it lasts: its logged metrics and its checkpoints. A launch
    stopped after adding to them (a second Ctrl-C, a data error at a later epoch) is one that ran."""
    metrics, checkpoints = run_dir / METRICS, run_dir / CHECKPOINTS
    stat = metrics.stat() if metrics.is_file() else None
    logged = (stat.st_size, stat.st_mtime_ns) if stat else None
    return logged, sorted(path.name for path in checkpoints.iterdir()) if checkpoints.is_dir() else []


def _put_back(record: Path, files: dict[str, bytes | None] | None) -> None:
    """Hydra's record folder as it was: ``files`` by name (None: no folder; a file's None: no such file)."""
    if files is None:
        shutil.rmtree(record, ignore_errors=True)
        return
    for name, content in files.items():
        if content is None:
            (record / name).unlink(missing_ok=True)
        else:
            write_atomically(record / name, lambda temporary, content=content: temporary.write_bytes(content))
