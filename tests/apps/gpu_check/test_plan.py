"""Where the GPU check writes (``gpu_check/runner.py``): an ``--out`` holding files no check wrote is refused with one
paragraph and exit 2, nothing in it changed; an earlier check's folder is taken, and each check trains in a run
folder of its own."""

import json
import runpy

import pytest

from dit_trainer.apps.gpu_check.plan import fresh_folder
from dit_trainer.apps.gpu_check.rows import write_report
from dit_trainer.apps.gpu_check.runner import require_own_folder
from dit_trainer.errors import ConfigError
from tests.conftest import REPO, digest, one_paragraph

HEADER = {"machine": {"device": "cpu", "peak_bf16_flops": None, "torch": "2.13", "cuda": None}, "options": {}}


def _users_folder(tmp_path):
    out = tmp_path / "gc"
    out.mkdir()
    (out / "gpu_check.json").write_text('{"mine": true}')  # e.g. the user's copy of another machine's report
    (out / "gpu_check.md").write_text("# my notes\n")
    return out


def test_the_check_refuses_an_out_folder_holding_the_users_files_with_exit_2(tmp_path, capsys):
    """scripts/gpu_check.sh's command in-process: refused before any row runs (it overwrote both files after the
    first row)."""
    out = _users_folder(tmp_path)
    before = digest(out)
    check = runpy.run_path(str(REPO / "scripts" / "gpu_check.py"))["check"]
    assert check(["--out", str(out), "--models", "pixart_xl_2", "--batches", "4", "--train-steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "`--out`" in err and "gpu_check.json, gpu_check.md" in err and "pass a new folder" in err
    assert digest(out) == before and sorted(path.name for path in out.iterdir()) == ["gpu_check.json", "gpu_check.md"]


@pytest.mark.parametrize("extra", ["notes.txt", "checkpoints"])
def test_a_folder_with_anything_else_beside_a_checks_report_is_refused(tmp_path, extra):
    out = tmp_path / "gc"
    out.mkdir()
    write_report(out, [], HEADER)  # what a check writes first
    require_own_folder(out)  # an earlier check's folder: taken
    (out / extra).mkdir() if extra == "checkpoints" else (out / extra).write_text("mine")
    with pytest.raises(ConfigError) as caught:
        require_own_folder(out)
    assert extra in one_paragraph(caught.value, "--out")


def test_an_earlier_checks_folder_is_taken_and_each_check_trains_in_a_new_run_folder(tmp_path):
    """A second check into README's fixed `--out` found the first one's checkpoints in runs/train-bf16, and
    train.py refused a fresh run there: the training row was reported failed."""
    out = tmp_path / "gc"
    out.mkdir()
    (out / "gpu_check.json").write_text(json.dumps({"machine": {}, "options": {}, "rows": []}))
    (out / "runs" / "train-bf16" / "checkpoints").mkdir(parents=True)
    require_own_folder(out)
    require_own_folder(tmp_path / "new")  # a folder that does not exist yet
    runs = [fresh_folder(out / "runs", "train-bf16") for _ in range(2)]
    assert [run.name for run in runs] == ["train-bf16-2", "train-bf16-3"]
    assert not any(list(run.iterdir()) for run in runs)
