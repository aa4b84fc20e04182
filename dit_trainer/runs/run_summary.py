"""The run folder's ``summary.json`` as a file: written at the end of each launch by the trainer
(``training.summary`` says what is in it) and added to by each export of the run (``exports``), which needs no part
of the training package."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from dit_trainer.durable import write_text_atomically

SUMMARY = "summary.json"
EXPORTS = "exports"  # the folders scripts/export.py wrote from the run, newest last


def _read(run_dir: Path) -> dict | None:
    try:
        summary = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def write_summary(summary: dict, run_dir: Path) -> Path:
    """Write ``summary`` as the run's ``summary.json``, keeping the exports an earlier file listed (a resumed run's
    end does not forget them)."""
    exports = (_read(run_dir) or {}).get(EXPORTS)
    path = run_dir / SUMMARY
    write_text_atomically(path, json.dumps(summary | ({EXPORTS: exports} if exports else {}), indent=2) + "\n")
    return path


def record_export(run_dir: Path, out_dir: Path) -> None:
    """Add an export's folder to the run's ``summary.json`` (``exports``, newest last; relative to the run folder
    when inside it). Best effort: a run folder without a summary (trained before there was one) or that this user
    cannot write (a teammate's run on shared storage) is left as it is; the export is complete either way."""
    summary = _read(run_dir)
    if summary is None:
        return
    out_dir, run_dir = out_dir.resolve(), run_dir.resolve()
    folder = str(out_dir.relative_to(run_dir)) if out_dir.is_relative_to(run_dir) else str(out_dir)
    summary[EXPORTS] = [entry for entry in summary.get(EXPORTS) or [] if entry != folder] + [folder]
    with contextlib.suppress(OSError):
        write_text_atomically(run_dir / SUMMARY, json.dumps(summary, indent=2) + "\n")
