"""scripts/gpu_check.sh on the CPU at tiny sizes, as CI runs it so that the GPU check cannot rot: every row is in
gpu_check.json and gpu_check.md, the measured ones with img/s, the CUDA-only ones skipped with the reason, and a
failing row (here: FSDP asked for with an accelerate config that is not there) recorded while the others run."""

import json
import subprocess

import pytest

from ..conftest import REPO

pytestmark = pytest.mark.slow


def test_the_gpu_check_runs_every_row_on_the_cpu_and_records_a_failed_one(tmp_path):
    missing = tmp_path / "no_such_fsdp.yaml"
    command = ["scripts/gpu_check.sh", "--out", str(tmp_path / "out"), "--steps", "2", "--warmup", "1",
               "--train-steps", "4", "--fsdp", "--fsdp-config", str(missing)]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    rows = {(row["name"], row["batch"]): row for row in report["rows"]}
    assert rows[("cuda tests", None)]["status"] == "skipped" and "no CUDA" in rows[("cuda tests", None)]["error"]
    trained = rows[("train bf16, checkpoint, resume, sample grid", 8)]
    assert trained["status"] == "ok" and "4 steps (2 + 2 resumed)" in trained["detail"]
    assert rows[("train fp16, checkpoint, resume, sample grid", None)]["status"] == "skipped"
    for what in ("bare", "trainer"):
        for model in ("pixart_xl_2", "dit_xl_2"):
            for batch in (4, 8):
                row = rows[(f"{what} {model} eager", batch)]
                assert row["status"] == "ok" and row["img_s"] > 0 and row["train_flops_per_image"] > 0, row
                assert row["mfu"] is None and row["sdpa_kernels"]  # no peak FLOP/s for a CPU; the kernel recorded
        assert rows[(f"{what} compile", None)]["status"] == "skipped"
    fsdp = [row for row in report["rows"] if row["kind"] == "fsdp"]
    assert [row["status"] for row in fsdp] == ["failed"] and str(missing) in fsdp[0]["error"]
    table = (tmp_path / "out" / "gpu_check.md").read_text()
    assert table.count("\n| ") == len(report["rows"]) + 1  # the header and one line per row
    assert "| trainer dit_xl_2 eager | ok | 8 |" in table and "| fsdp2 2 processes | failed |" in table
    assert str(tmp_path / "out" / "gpu_check.md") in result.stdout
