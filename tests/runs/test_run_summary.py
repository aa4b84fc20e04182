"""The run folder's summary.json as a file (``run_summary.py``): each export of the run listed, kept through the
summary a resumed run writes."""

from __future__ import annotations

import json
from pathlib import Path

from dit_trainer.runs.run_summary import record_export, write_summary
from dit_trainer.training.summary import RunEnd, summarize
from tests.training.test_summary import RECORDS


def test_exports_are_recorded_and_kept_through_a_resumed_runs_summary(tmp_path):
    summary = summarize(RECORDS, RunEnd("completed", 30, 30, 0, 5.0, 1.0, None), tmp_path)
    record_export(tmp_path, tmp_path / "export" / "checkpoint-30")  # no summary.json yet: nothing to record
    assert not (tmp_path / "summary.json").exists()
    write_summary(summary, tmp_path)
    for folder in (tmp_path / "export" / "checkpoint-30", tmp_path.parent / "shared" / "mine"):
        record_export(tmp_path, folder)
    record_export(tmp_path, tmp_path / "export" / "checkpoint-30")  # exported again: moved to the end, not repeated
    expected = [str(tmp_path.parent.resolve() / "shared" / "mine"), str(Path("export/checkpoint-30"))]
    assert json.loads((tmp_path / "summary.json").read_text())["exports"] == expected
    write_summary(summary | {"steps": 40}, tmp_path)  # a resumed run's end
    assert json.loads((tmp_path / "summary.json").read_text())["exports"] == expected
