"""``scripts/reward_curve.py``: reward fine-tuning runs' ``reward/mean`` against their training seconds, and how long
each run after the first took to reach the first's final reward; a folder that is no run is refused, not read as a
run that never got there."""

import json

from ..conftest import run_here


def _run(folder, records):
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return folder


def test_the_second_run_reaches_the_firsts_final_reward_in_its_share_of_the_time(tmp_path):
    logged = [{"step": 10, "seconds_per_step": 2.0}, {"step": 10, "reward/mean": 0.8},
              {"step": 20, "seconds_per_step": 2.0}, {"step": 20, "reward/mean": 0.9}]  # fmt: skip
    slow = _run(tmp_path / "grpo", logged)
    fast = _run(tmp_path / "nft", [{"step": 10, "seconds_per_step": 1.0}, {"step": 10, "reward/mean": 0.95}])
    result = run_here(["scripts/reward_curve.py", str(slow), str(fast)])
    assert result.returncode == 0, result.stderr
    assert f"{slow}: final reward/mean 0.9000 after 40 s of training" in result.stdout
    assert f"{fast}: reaches it after 10 s (0.25 of its time)" in result.stdout


def test_a_folder_without_metrics_is_refused_naming_it(tmp_path):
    """A mistyped second run printed "reaches it never" and exit 0."""
    run = _run(tmp_path / "grpo", [{"step": 10, "seconds_per_step": 1.0}, {"step": 10, "reward/mean": 0.9}])
    result = run_here(["scripts/reward_curve.py", str(run), str(tmp_path / "typo")])
    assert result.returncode == 2 and f"no metrics.jsonl in {tmp_path / 'typo'}: pass run folders" in result.stderr
    assert "Traceback" not in result.stderr and "reaches it" not in result.stdout
