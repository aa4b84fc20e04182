"""scripts/gpu_check.sh on the CPU at tiny sizes, as CI runs it so that the GPU check cannot rot, in two calls into
one --out as a lent GPU machine runs it (commands of at most ~10 minutes): the first stops before a row that would
not fit its --budget, the second measures only the rows the first did not finish, and the report then lists every
row once: the measured ones with img/s (online fine-tuning epochs among them), the CUDA-only ones skipped with the
reason, and a failing row (here: FSDP asked for with an accelerate config that is not there) recorded while the
others ran."""

import json
import subprocess

import pytest

from ..conftest import REPO

pytestmark = pytest.mark.slow


def _call(out, missing, *extra):
    command = ["scripts/gpu_check.sh", "--out", str(out), "--models", "pixart_xl_2", "--steps", "2", "--warmup", "1",
               "--train-steps", "4", "--fsdp", "--fsdp-config", str(missing), "--online", *extra]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout, json.loads((out / "gpu_check.json").read_text())


def test_two_calls_with_a_budget_finish_the_plan_and_the_report_lists_every_row_once(tmp_path):
    out, missing = tmp_path / "out", tmp_path / "no_such_fsdp.yaml"
    # The plan's estimates add up to ~2 min; the first row runs whatever the start-up took (under 80 s), and what
    # runs before the FSDP row (~1 min of measuring on this machine) leaves too little of 80 s for its 41.
    printed, first = _call(out, missing, "--budget", "80")
    measured = {row["id"] for row in first["rows"] if row["status"] == "ok"}
    assert measured and "fsdp2-2p" not in measured
    assert "Stopping before" in printed and "rows left: call again" in printed
    printed, report = _call(out, missing)
    again = [line.split()[0] for line in printed.splitlines() if line.endswith(" ...")]
    assert "fsdp2-2p" in again and not set(again) & measured  # only what the first call did not finish
    assert "every row is measured" in printed
    ids = [row["id"] for row in report["rows"]]
    kept = [row for row in first["rows"] if row["id"] in measured]
    assert [row for row in report["rows"] if row["id"] in measured] == kept  # as the first call wrote them
    assert len(report["calls"]) == 2
    throughput = [f"{what}-pixart_xl_2-eager-b4+8" for what in ("trainer", "bare")]
    online = [f"{method}-pixart_xl_2-eager-b4" for method in ("grpo", "nft")]
    assert ids == ["cuda-tests", "train-bf16", "train-fp16", *[i for i in throughput for _ in (4, 8)], *online,
                   "fsdp2-2p"]  # fmt: skip
    rows = {(row["name"], row["batch"]): row for row in report["rows"]}
    assert rows[("cuda tests", None)]["status"] == "skipped" and "no CUDA" in rows[("cuda tests", None)]["error"]
    trained = rows[("train bf16, checkpoint, resume, sample grid", 8)]
    assert trained["status"] == "ok" and "4 steps (2 + 2 resumed)" in trained["detail"]
    assert rows[("train fp16, checkpoint, resume, sample grid", None)]["status"] == "skipped"
    for what in ("bare", "trainer"):
        for batch in (4, 8):
            row = rows[(f"{what} pixart_xl_2 eager", batch)]
            assert row["status"] == "ok" and row["img_s"] > 0 and row["train_flops_per_image"] > 0, row
            assert row["mfu"] is None and row["sdpa_kernels"]  # no peak FLOP/s for a CPU; the kernel recorded
    for method in ("grpo", "nft"):  # an epoch of rollouts, rewards and update; no MFU (its FLOPs are the sampler's)
        row = rows[(f"{method} pixart_xl_2 eager", 4)]
        assert row["status"] == "ok" and row["img_s"] > 0 and row["train_flops_per_image"] is None, row
    fsdp = [row for row in report["rows"] if row["kind"] == "fsdp"]
    assert [row["status"] for row in fsdp] == ["failed"] and str(missing) in fsdp[0]["error"]
    table = (out / "gpu_check.md").read_text()
    assert table.count("\n| ") == len(report["rows"]) + 1  # the header and one line per row
    assert "| trainer pixart_xl_2 eager | ok | 8 |" in table and "| fsdp2 2 processes | failed |" in table
    assert str(out / "gpu_check.md") in printed
