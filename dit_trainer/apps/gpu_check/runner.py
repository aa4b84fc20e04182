"""Running the plan in calls of bounded length: a GPU machine is lent for commands of at most ~10 minutes, so a call
runs the rows that fit its ``--budget``, writes the report after every row, and a second call into the same
``--out`` runs only the rows the first did not finish, until the plan is done. The report lists every row once;
an earlier call's rows (and the training runs they made) are kept, never replaced, unless ``--redo`` names them."""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from dit_trainer.apps.gpu_check.plan import Options, PlannedRow
from dit_trainer.apps.gpu_check.rows import JSON_NAME, MARKDOWN_NAME, TIMED_OUT, Row, guarded, read_rows, write_report
from dit_trainer.errors import ConfigError, shortlist

# Rows a later call runs again: skipped ones (their cause may be gone: a compiler installed since) and those the
# budget stopped (their time-out was what was left of a call, not --row-timeout).
AGAIN = ("skipped", "stopped")
# What the check writes into --out: the report, and the folders of its rows' assets, runs, results and work.
OWN_NAMES = (JSON_NAME, MARKDOWN_NAME, "assets", "runs", "results", "work")
CALL_SECONDS = 30  # what a call costs before its first row: imports, the tiny assets, the plan
CALL_BUDGET = 540  # the call length --plan splits a plan into when no --budget is given: 9 of a 10-minute command


def _matches(row_id: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(row_id, pattern) for pattern in patterns)


def select(planned: list[PlannedRow], rows: tuple[str, ...], skip: tuple[str, ...]) -> list[PlannedRow]:
    """The planned rows ``--rows`` picks (all without it) less those ``--skip`` names; a pattern that names no row
    is refused with the ids there are, since a typo would otherwise quietly measure nothing."""
    ids = [row.id for row in planned]
    for option, patterns in (("--rows", rows), ("--skip", skip)):
        unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(i, p) for i in ids)]
        if unknown:
            raise ConfigError(
                option,
                ",".join(unknown),
                f"no planned row matches it (rows: {shortlist(ids, 12)})",
                f"name row ids or shell patterns of them, e.g. `{option} 'trainer-*,train-bf16'`",
            )
    return [row for row in planned if (not rows or _matches(row.id, rows)) and not _matches(row.id, skip)]


def _read_report(out: Path) -> dict | None:
    """The report a check wrote into ``out``, or None (no report there, or not one of a check's)."""
    try:
        report = json.loads((out / JSON_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return report if isinstance(report, dict) and {"machine", "rows"} <= report.keys() else None


def require_own_folder(out: Path) -> dict | None:
    """``--out`` is new, empty, or a folder an earlier check wrote (its report, and nothing but the check's own
    names): returns that report. A user's files (their own ``gpu_check.json``, notes, another tool's output) are
    refused, never overwritten. A training row's run folder is new in every call (``plan.fresh_folder``)."""
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", str(out), "it is a file, not a folder", "pass a new folder")
    entries = sorted(out.iterdir()) if out.is_dir() else []
    names = [entry.name + ("/" if entry.is_dir() else "") for entry in entries]
    foreign = [name for entry, name in zip(entries, names) if entry.name not in OWN_NAMES]
    report = _read_report(out) if entries else None
    if foreign or (entries and report is None):
        foreign = foreign or names  # no report: none of it is an earlier check's
        raise ConfigError(
            "--out",
            str(out),
            f"it holds {shortlist(foreign, 4)}, which no GPU check wrote (an earlier check's folder holds its "
            f"{JSON_NAME} report), and the check writes {', '.join(OWN_NAMES)} there",
            "pass a new folder, e.g. `--out outputs/gpu_check/h100-2` (the default is a new dated one), or move "
            "those files away",
        )
    return report


def _same_machine(report: dict, machine: dict, out: Path) -> None:
    """Rows of two machines in one report would read as one machine's: refused."""
    measured_on = {key: report["machine"].get(key) for key in ("device", "gpus")}
    if measured_on != {key: machine[key] for key in ("device", "gpus")}:
        raise ConfigError("--out", str(out), f"its rows were measured on {measured_on['device']} "
                          f"({measured_on['gpus']} GPUs) and this machine is {machine['device']} ({machine['gpus']})",
                          "pass a new folder for this machine")  # fmt: skip


def describe(planned: list[PlannedRow], done: set[str], budget: float | None) -> str:
    """The plan as printed before a call runs: each row's id, estimate and state, the total, and how the rows
    still to run fall into calls of the budget (``CALL_BUDGET`` without one)."""
    todo = [row for row in planned if row.id not in done]
    width = max((len(row.id) for row in planned), default=0)
    lines = [f"  {row.id:<{width}}  ~{row.seconds / 60:4.1f} min  "
             + ("measured" if row.id in done else f"skipped: {row.skipped}" if row.skipped else "to run")
             for row in planned]  # fmt: skip
    calls = split_into_calls(todo, budget or CALL_BUDGET)
    total = sum(row.seconds for row in todo) + CALL_SECONDS * len(calls)
    sizes = ", ".join(f"{len(call)} rows" for call in calls)
    lines.append(f"{len(todo)} of {len(planned)} rows to run: ~{total / 60:.1f} min in {len(calls)} call(s) of at "
                 f"most {(budget or CALL_BUDGET) / 60:.1f} min ({sizes})" if todo else
                 f"0 of {len(planned)} rows to run: every row is measured")  # fmt: skip
    return "\n".join(lines)


def split_into_calls(rows: list[PlannedRow], budget: float) -> list[list[PlannedRow]]:
    """The rows in order, cut into calls of at most ``budget`` seconds each (a call's start-up included); a row
    longer than a whole call gets one of its own (its time-out is the budget)."""
    calls: list[list[PlannedRow]] = []
    left = 0.0
    for row in rows:
        if not calls or row.seconds > left:
            calls.append([])
            left = budget - CALL_SECONDS
        calls[-1].append(row)
        left -= row.seconds
    return calls


def _upsert(rows: list[Row], new: list[Row]) -> list[Row]:
    """``rows`` with ``new`` (one planned row's) in place of that row's earlier lines, or after them all."""
    row_id = new[0].id if new else None
    at = next((index for index, row in enumerate(rows) if row.id == row_id), len(rows))
    return [*(row for row in rows[:at] if row.id != row_id), *new, *(row for row in rows[at:] if row.id != row_id)]


def run_plan(options: Options, planned: list[PlannedRow], header: dict, started: float,
             say: Callable[[str], None] = print) -> tuple[Path, Path]:  # fmt: skip
    """Run the rows of ``planned`` not measured by an earlier call into ``options.out``, in order, while the
    budget lasts (a row whose estimate no longer fits ends the call; each row's time-out is at most what is left),
    the report rewritten after each; returns the JSON and Markdown paths."""
    report = require_own_folder(options.out)
    if report is not None:
        _same_machine(report, header["machine"], options.out)
    rows = read_rows(report) if report else []
    calls = [*(report or {}).get("calls", []), {"started": time.strftime("%Y-%m-%d %H:%M:%S"), **header["options"]}]
    header = {**header, "calls": calls}
    redo = {row.id for row in planned if _matches(row.id, options.redo)}  # only rows this call plans
    done = {row.id for row in rows if row.status not in AGAIN} - redo
    say(f"The GPU check on {header['machine']['device']}:\n{describe(planned, done, options.budget)}")
    options.out.mkdir(parents=True, exist_ok=True)
    paths = write_report(options.out, rows, header)  # the folder is the check's from now on
    ran = 0
    for row in (row for row in planned if row.id not in done):
        left = None if options.budget is None else options.budget - (time.monotonic() - started)
        # a row longer than a whole call runs first in a call of its own, within what is left of it (if that is
        # not enough either, it failed: no call can hold it)
        if left is not None and (row.seconds > left and ran or left <= 0):
            say(f"Stopping before {row.id} (~{row.seconds:.0f} s; {max(left, 0):.0f} s of --budget "
                f"{options.budget:g} left): call again with the same --out to go on.")  # fmt: skip
            break
        say(f"{row.id} (~{row.seconds:.0f} s) ...")
        timeout = options.row_timeout if left is None else min(options.row_timeout, left)
        measured = guarded(row.id, row.kind, lambda row=row, timeout=timeout: row.measure(timeout))
        if timeout < options.row_timeout and ran:  # the budget cut it after other rows: the next call runs it first
            measured = [replace(new, status="stopped") if TIMED_OUT in new.error else new for new in measured]
        ran += row.seconds > 0
        rows = _upsert(rows, [replace(new, id=row.id) for new in measured])
        paths = write_report(options.out, rows, header)
        say(f"{row.id}: {', '.join(sorted({new.status for new in measured}))}; report: {paths[0]}")
    measured_ids = {row.id for row in rows if row.status not in AGAIN}
    left = [row.id for row in planned if row.id not in measured_ids and not row.skipped]
    say(f"{len(left)} of {len(planned)} rows left: call again with the same --out" if left else "every row is measured")
    return paths


def header_of(options: Options, machine: dict) -> dict:
    return {"machine": machine, "options": {key: str(value) for key, value in asdict(options).items()}}
