"""The check in calls of bounded length (``gpu_check/runner.py``): a call stops before a row that would not fit its
budget, a second call into the same ``--out`` measures only what the first did not, the report lists every row once
and keeps the earlier call's rows, and a plan for one H100 fits repeated 10-minute calls and 40 minutes in all."""

import json
import runpy
from dataclasses import replace
from pathlib import Path

import pytest

from dit_trainer.apps.gpu_check.plan import Options, PlannedRow
from dit_trainer.apps.gpu_check.rows import TIMED_OUT, Row
from dit_trainer.apps.gpu_check.runner import CALL_SECONDS, run_plan, select, split_into_calls
from dit_trainer.errors import ConfigError
from tests.conftest import REPO, one_paragraph

MACHINE = {"device": "cpu (x86_64)", "gpus": 0, "peak_bf16_flops": None, "torch": "2.13", "cuda": None}
HEADER = {"machine": MACHINE, "options": {}}


def _options(out: Path, **changes) -> Options:
    options = Options(REPO, out, True, ("pixart_xl_2",), None, ("eager",), 1, 2, 4, False, None, 540)
    return replace(options, **changes)


class Clock:
    """Rows that take the time they are estimated to take, on a clock the runner reads through ``started``."""

    def __init__(self, monkeypatch):
        self.now = 1000.0
        self.measured: list[tuple[str, float]] = []
        monkeypatch.setattr("dit_trainer.apps.gpu_check.runner.time.monotonic", lambda: self.now)

    def row(self, row_id: str, seconds: float, takes: float | None = None) -> PlannedRow:
        """A row estimated at ``seconds`` that takes ``takes`` (its estimate), stopped at its time-out."""

        def measure(timeout: float) -> list[Row]:
            self.measured.append((row_id, timeout))
            took = min(seconds if takes is None else takes, timeout)
            self.now += took
            if took < (seconds if takes is None else takes):
                return [Row(f"row {row_id}", "throughput", "failed", took, error=f"timed out: \n{TIMED_OUT} of 1 s")]
            return [Row(f"row {row_id}", "throughput", "ok", seconds, batch=b) for b in (4, 8)]

        return PlannedRow(row_id, "throughput", seconds, measure)


def _report(out: Path) -> dict:
    return json.loads((out / "gpu_check.json").read_text())


def test_a_second_call_measures_only_what_the_first_did_not_and_the_report_lists_each_row_once(tmp_path, monkeypatch):
    clock = Clock(monkeypatch)
    planned = [clock.row("a", 40), clock.row("b", 40), clock.row("c", 40), clock.row("d", 10)]
    out = tmp_path / "gc"
    run_plan(_options(out, budget=100), planned, HEADER, started=clock.now, say=lambda text: None)
    assert [row_id for row_id, _ in clock.measured] == ["a", "b"]  # c (40 s) no longer fits the 20 s left
    assert [row["id"] for row in _report(out)["rows"]] == ["a", "a", "b", "b"]  # each written as it finished
    assert clock.measured[1][1] == 60  # a row's time-out is at most what is left of the budget
    printed = []
    run_plan(_options(out, budget=100), planned, HEADER, started=clock.now, say=printed.append)
    assert [row_id for row_id, _ in clock.measured] == ["a", "b", "c", "d"]
    report = _report(out)
    assert [row["id"] for row in report["rows"]] == ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert len(report["calls"]) == 2 and "2 of 4 rows to run" in printed[0] and "measured" in printed[0]
    run_plan(_options(out, budget=100, redo=("c",)), planned, HEADER, started=clock.now, say=lambda text: None)
    assert [row_id for row_id, _ in clock.measured][4:] == ["c"]  # --redo: measured again, in its place
    assert [row["id"] for row in _report(out)["rows"]] == ["a", "a", "b", "b", "c", "c", "d", "d"]


def test_a_row_the_budget_cut_runs_first_in_the_next_call_and_one_no_call_can_hold_fails(tmp_path, monkeypatch):
    clock = Clock(monkeypatch)
    out, quiet = tmp_path / "gc", (lambda text: None)
    planned = [clock.row("quick", 10), clock.row("slow", 30, takes=95), clock.row("long", 200), clock.row("after", 10)]
    for _ in range(4):
        run_plan(_options(out, budget=100), planned, HEADER, started=clock.now, say=quiet)
    # call 1: quick, then slow cut at the 90 s left ("stopped"); call 2: slow first, with the whole call; call 3: long,
    # longer than any call, alone (failed at its time-out, not tried again); call 4: the rest
    assert clock.measured == [("quick", 100), ("slow", 90), ("slow", 100), ("long", 100), ("after", 100)]
    statuses = {row["id"]: row["status"] for row in _report(out)["rows"]}
    assert statuses == {"quick": "ok", "slow": "ok", "long": "failed", "after": "ok"}


def test_redo_measures_again_only_the_rows_this_call_plans(tmp_path, monkeypatch):
    clock = Clock(monkeypatch)
    out, quiet = tmp_path / "gc", (lambda text: None)
    run_plan(_options(out), [clock.row("a", 1), clock.row("b", 1)], HEADER, started=clock.now, say=quiet)
    run_plan(_options(out, redo=("*",)), [clock.row("b", 1)], HEADER, started=clock.now, say=quiet)  # --rows b
    assert [row_id for row_id, _ in clock.measured] == ["a", "b", "b"]
    assert [row["id"] for row in _report(out)["rows"]] == ["a", "a", "b", "b"]  # a's rows kept


def test_the_check_keeps_its_folder_when_another_machine_would_add_rows(tmp_path, monkeypatch):
    clock = Clock(monkeypatch)
    out = tmp_path / "gc"
    run_plan(_options(out), [clock.row("a", 1)], HEADER, started=clock.now, say=lambda text: None)
    before = (out / "gpu_check.json").read_text()
    gpu = {"machine": {**MACHINE, "device": "NVIDIA H100 80GB HBM3", "gpus": 1}, "options": {}}
    with pytest.raises(ConfigError) as caught:
        run_plan(_options(out), [clock.row("b", 1)], gpu, started=clock.now, say=lambda text: None)
    assert "NVIDIA H100" in one_paragraph(caught.value, "--out") and (out / "gpu_check.json").read_text() == before


def test_rows_and_skip_pick_rows_by_id_pattern_and_a_pattern_matching_nothing_is_refused(monkeypatch):
    clock = Clock(monkeypatch)
    planned = [clock.row(i, 1) for i in ("train-bf16", "bare-dit_xl_2-eager-b64", "trainer-dit_xl_2-eager-b64")]
    assert [r.id for r in select(planned, ("*-dit_xl_2-*",), ("bare-*",))] == ["trainer-dit_xl_2-eager-b64"]
    with pytest.raises(ConfigError) as caught:
        select(planned, ("trainer-pixart*",), ())
    assert "train-bf16" in one_paragraph(caught.value, "--rows")  # the ids there are


def test_calls_hold_at_most_their_budget(monkeypatch):
    clock = Clock(monkeypatch)
    calls = split_into_calls([clock.row(str(i), s) for i, s in enumerate([200, 250, 100, 600, 30])], 540)
    assert [[row.id for row in call] for call in calls] == [["0", "1"], ["2"], ["3"], ["4"]]


def test_the_plan_for_one_h100_fits_ten_minute_calls_and_forty_minutes(capsys):
    """What the issue asks of the default plan, printed from this CPU machine with --plan --plan-for."""
    check = runpy.run_path(str(REPO / "scripts" / "gpu_check.py"))["check"]
    assert check(["--plan", "--plan-for", "NVIDIA H100 80GB HBM3", "--budget", "540"]) == 0
    printed = capsys.readouterr().out
    rows = [line.split() for line in printed.splitlines() if line.startswith("  ")]
    minutes = [float(cells[1].lstrip("~")) if cells[1] != "~" else float(cells[2]) for cells in rows]
    ids = [cells[0] for cells in rows]
    assert {"cuda-tests", "train-bf16", "train-fp16", "trainer-dit_xl_2-compile-b128", "fsdp2-1p"} <= set(ids)
    assert "trainer-pixart_xl_2-checkpointing-b256" in ids and max(minutes) * 60 <= 540 - CALL_SECONDS
    summary = printed.strip().splitlines()[-1]
    total = float(summary.split("~")[1].split(" min")[0])
    assert f"{len(ids)} of {len(ids)} rows to run" in summary and total <= 40 - 3  # the install's minutes beside it
    assert {
        "trainer-dit_xl_2-fp8-b128",
        "trainer-dit_xl_2-selective-b192",
        "trainer-dit_xl_2-accumulation-b128",
        "trainer-dit_xl_2-fused_qkv-b128",
    } <= set(ids)  # the levers, each a row
