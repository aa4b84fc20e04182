"""The GRPO reward monitor in real ``train.py`` runs: what it logs, that it never changes training, and DDP."""

import json

import pytest

from dit_trainer.runs.run_folder import list_checkpoints

from ..conftest import (
    CPU_PROCESSES,
    QUIET,
    REPO,
    TINY_SHAPES,
    accelerate_launch,
    read_metrics,
    run_here,
    run_script,
    train_here,
)

MONITOR_ON = (
    "monitor.reward.enabled=true",
    "monitor.reward.every_n_steps=10",
    "monitor.reward.batch_size=96",
)
COMMON = ("trainer.max_steps=20", *QUIET, "trainer.checkpoint_every=10")


@pytest.fixture(scope="module")
def monitored_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("monitor") / "run"
    result = train_here(run_dir, *COMMON, *MONITOR_ON)
    return run_dir, result


@pytest.mark.slow
def test_monitor_logs_reward_and_group_statistics_at_its_steps(monitored_run):
    run_dir, result = monitored_run
    records = read_metrics(run_dir)
    monitored = [r for r in records if "reward/mean" in r]
    assert [r["step"] for r in monitored] == [10, 20]
    keys = {"reward/mean", "reward/std", "reward/shapes_alignment", "grpo/adv_abs_mean", "grpo/zero_std_frac"}
    for record in monitored:
        assert keys | {"monitor/seconds", "loss"} <= set(record)  # one line per step: training and monitor metrics
        assert 0 <= record["reward/mean"] <= 1 and 0 <= record["grpo/zero_std_frac"] <= 1
        assert record["monitor/seconds"] > 0
    assert sorted(p.name for p in (run_dir / "rewards").iterdir()) == ["step_0000010.png", "step_0000020.png"]
    assert "monitors took" in result.stdout


@pytest.mark.slow
def test_training_with_the_monitor_is_bit_identical_to_training_without(monitored_run, tmp_path):
    train_here(tmp_path / "off", *COMMON)
    with_monitor = [r["loss"] for r in read_metrics(monitored_run[0])]
    without = [r["loss"] for r in read_metrics(tmp_path / "off")]
    assert len(without) == 20 and with_monitor == without


@pytest.mark.slow
def test_evaluate_reproduces_the_monitor_s_reward_from_the_checkpoint(monitored_run, tmp_path):
    run_dir = monitored_run[0]
    result = run_here(
        [
            "scripts/evaluate.py",
            str(run_dir),
            f"checkpoint={run_dir / 'checkpoints' / 'checkpoint-10'}",
            "batch_size=96",
            f"out_dir={tmp_path / 'eval'}",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    monitored = next(r for r in read_metrics(run_dir) if r["step"] == 10)
    assert report["reward/mean"] == pytest.approx(monitored["reward/mean"], abs=1e-6)
    assert report["prompts"] == 24 and report["images_per_prompt"] == 4
    assert {"color", "shape"} <= set(report) and len(report["per_prompt"]) == 24
    assert (tmp_path / "eval" / "grid.png").is_file()
    assert json.loads(result.stdout.strip().splitlines()[-1])["images"] == 96


@pytest.mark.slow
def test_monitor_config_errors_name_the_key(tmp_path):
    result = run_here(["train.py", *TINY_SHAPES, "monitor.reward.enabled=true", "monitor.reward.group_size=1",
                       f"hydra.run.dir={tmp_path / 'run'}"])  # fmt: skip
    assert result.returncode == 2 and "monitor.reward.group_size" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_monitor_runs_once_per_call_under_two_process_ddp(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        "trainer.max_steps=10",
        "trainer.log_every=5",
        "trainer.sample_every=10",
        "trainer.checkpoint_every=0",
        "monitor.reward.enabled=true",
        "monitor.reward.every_n_steps=5",
        "monitor.reward.prompt_file=null",
        "monitor.reward.prompts=[a red circle,a blue square]",
    ]
    result = run_script(
        [*accelerate_launch(), "train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *overrides],
        timeout=300,
        env=CPU_PROCESSES,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("Trained 10 steps") == 1  # one summary, from the main process
    monitored = [r["step"] for r in read_metrics(run_dir) if "reward/mean" in r]
    assert monitored == [5, 10]  # written once per call, by the main process
    assert sorted(p.name for p in (run_dir / "rewards").iterdir()) == ["step_0000005.png", "step_0000010.png"]


@pytest.mark.slow
def test_a_reward_monitor_that_fails_under_two_process_ddp_stops_both_after_its_step_s_checkpoint(tmp_path):
    """The main process's monitor raises while the other waits at its barrier: both processes stop (no hang), after
    writing that step's checkpoint together, and the error names the monitor, its cause and how to continue."""
    run_dir = tmp_path / "run"
    overrides = ["trainer.max_steps=4", "trainer.log_every=1", "trainer.sample_every=0", "trainer.checkpoint_every=0",
                 "monitor.reward.enabled=true", "monitor.reward.every_n_steps=2", "monitor.reward.prompt_file=null",
                 "monitor.reward.prompts=[a red circle]", "reward=none",
                 "+reward.weights={toy_rewards\\:OUT_OF_MEMORY:1.0}"]  # fmt: skip
    result = run_script(
        [*accelerate_launch(), "train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *overrides],
        timeout=300,
        env={**CPU_PROCESSES, "PYTHONPATH": str(REPO / "tests" / "plugins")},
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "GRPORewardMonitor at step 2: MemoryError: the reward model ran out of memory" in output, output[-4000:]
    assert f"trainer.resume={run_dir}" in output
    assert [path.name for path in list_checkpoints(run_dir / "checkpoints")] == ["checkpoint-2"]
    for rank in range(2):  # written by both processes
        assert (run_dir / "checkpoints" / "checkpoint-2" / f"trainer_state_{rank}.safetensors").is_file()
    assert [record["step"] for record in read_metrics(run_dir)] == [1, 2]
