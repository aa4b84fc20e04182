"""The GPU check's rows: a failing, crashing or hanging subprocess is recorded, and the report keeps every row."""

import json
import sys
import textwrap

import psutil

from dit_trainer.apps.gpu_check.rows import Command, Row, guarded, markdown, run_command, with_mfu, write_report

# A row that starts what `accelerate launch` starts: a rank in a session of its own (torch elastic's workers), its
# output elsewhere, and a helper in the row's own group holding the row's output pipe; then it hangs.
LAUNCHER = textwrap.dedent("""
    import subprocess, sys, time
    rank = subprocess.Popen(["sleep", "60"], start_new_session=True, stdout=subprocess.DEVNULL)
    helper = subprocess.Popen(["sleep", "60"])
    open(sys.argv[1], "w").write(f"{rank.pid} {helper.pid}")
    time.sleep(60)
""")


def test_a_failing_subprocess_is_an_outcome_with_its_output(tmp_path):
    outcome = run_command(Command([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], tmp_path))
    assert outcome.returncode == 3 and outcome.failure.startswith("exit code 3") and "boom" in outcome.failure
    assert run_command(Command([sys.executable, "-c", "print('fine')"], tmp_path)).failure == ""


def test_a_hanging_subprocess_is_killed_and_recorded_as_timed_out(tmp_path):
    outcome = run_command(Command([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, timeout=1))
    assert outcome.returncode is None and outcome.failure.startswith("timed out") and outcome.seconds < 10


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_row_that_times_out_leaves_none_of_its_processes_running(tmp_path):
    """subprocess.run's timeout killed only the launcher: the rank kept running, and the helper holding the pipe
    kept run() waiting for the end of the output long after the timeout."""
    pids = tmp_path / "pids"
    outcome = run_command(Command([sys.executable, "-c", LAUNCHER, str(pids)], tmp_path, timeout=3))
    started = [int(pid) for pid in pids.read_text().split()]
    try:
        assert outcome.returncode is None and outcome.seconds < 20
        assert outcome.failure.endswith("stopped after its time-out of 3 s, with every process it started")
        assert not any(_running(pid) for pid in started)
    finally:
        for pid in started:  # the test's own processes, should the check above fail
            if _running(pid):
                psutil.Process(pid).kill()


def test_an_exception_in_a_row_is_a_failed_row_not_the_end_of_the_check():
    def broken() -> list[Row]:
        raise KeyError("batches")

    [row] = guarded("trainer pixart_xl_2", "throughput", broken)
    assert (row.status, row.name) == ("failed", "trainer pixart_xl_2") and "KeyError" in row.error


def test_the_report_keeps_failed_and_measured_rows_in_json_and_markdown(tmp_path):
    measured = with_mfu(Row("bare pixart_xl_2 eager", "throughput", "ok", batch=64, img_s=400.0,
                            train_flops_per_image=1e12), peak=989.4e12)  # fmt: skip
    failed = Row("fsdp2 8 processes", "fsdp", "failed", error="exit code 1: Traceback ...\nRuntimeError: NCCL timeout")
    header = {"machine": {"device": "NVIDIA H100 80GB HBM3", "peak_bf16_flops": 989.4e12, "torch": "2.13",
                          "cuda": "12.8"}}  # fmt: skip
    json_path, markdown_path = write_report(tmp_path, [measured, failed], header)
    rows = json.loads(json_path.read_text())["rows"]
    assert [row["status"] for row in rows] == ["ok", "failed"]
    assert rows[0]["mfu"] == 400 * 1e12 / 989.4e12
    table = markdown_path.read_text()
    assert "| bare pixart_xl_2 eager | ok | 64 | 400.0 |" in table and "40.4%" in table
    assert "| fsdp2 8 processes | failed |" in table and "RuntimeError: NCCL timeout" in table  # the cause, one line
    assert table == markdown(json.loads(json_path.read_text()))
    assert table.startswith("# GPU check: NVIDIA H100 80GB HBM3, torch 2.13, CUDA 12.8, peak bf16 989.4 TFLOP/s (")
    on_cpu = {"machine": {**header["machine"], "peak_bf16_flops": None}, "rows": [], "finished": "now"}
    assert "CUDA 12.8, no known bf16 peak (MFU not computed) (now)" in markdown(on_cpu)  # was "peak bf16  TFLOP/s"
