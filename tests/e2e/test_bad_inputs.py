"""The bad-input table through ``train.py`` and ``scripts/sample.py``: each bad value, run folder, resume or data
folder gets one paragraph naming the problem and the fix (exit 2, no traceback), and nothing already written (a
checkpoint, the metrics) is modified."""

import json
import shutil

import pytest

from ..conftest import QUIET, TINY_SHAPES, digest, run_script, train


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("bad_inputs") / "run"
    train(run_dir, "trainer.max_steps=2", *QUIET)
    return run_dir


def _refused(run_dir, *overrides: str, into=None) -> str:
    """Run train.py with ``overrides`` into ``into`` (default: the finished run); it must exit 2 without a
    traceback and leave the finished run's files (checkpoints, metrics, config) as they were. Returns stderr."""
    owned = ("checkpoints", "metrics", "config.yaml")
    before = digest(run_dir)
    result = run_script(
        ["train.py", *TINY_SHAPES, f"hydra.run.dir={into or run_dir}", "trainer.sample_every=0", *overrides],
        timeout=240,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert {k: v for k, v in digest(run_dir).items() if k.startswith(owned)} == {
        k: v for k, v in before.items() if k.startswith(owned)
    }
    return result.stderr


@pytest.mark.slow
def test_a_fresh_run_over_a_finished_one_is_refused(finished_run):
    assert "already holds checkpoints" in _refused(finished_run, "trainer.max_steps=4")


@pytest.mark.slow
def test_resuming_from_a_folder_that_is_not_a_checkpoint_is_refused(finished_run, tmp_path):
    stderr = _refused(finished_run, "trainer.max_steps=4", f"trainer.resume={tmp_path}", into=tmp_path / "new")
    assert "`trainer.resume`" in stderr and "not a checkpoint folder" in stderr


@pytest.mark.slow
def test_resuming_a_checkpoint_of_another_model_shape_is_refused(finished_run, tmp_path):
    """Refused from the checkpoint's recorded config; with the change allowed, from the weights themselves."""
    checkpoint = finished_run / "checkpoints" / "checkpoint-2"
    stderr = _refused(finished_run, "model.num_layers=3", f"trainer.resume={checkpoint}", into=tmp_path / "new")
    assert "another model, data or objective: model.num_layers (2 -> 3)" in stderr
    assert "trainer.allow_config_change=true" in stderr
    stderr = _refused(finished_run, "model.num_layers=3", f"trainer.resume={checkpoint}",
                      "trainer.allow_config_change=true", into=tmp_path / "new")  # fmt: skip
    assert "its weights do not fit the configured model" in stderr and "config.yaml" in stderr


@pytest.mark.slow
def test_resuming_a_truncated_checkpoint_is_refused(finished_run, tmp_path):
    copy = tmp_path / "checkpoint-2"
    shutil.copytree(finished_run / "checkpoints" / "checkpoint-2", copy)
    weights = copy / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    stderr = _refused(finished_run, f"trainer.resume={copy}", into=tmp_path / "new")
    assert "not a complete checkpoint" in stderr and "diffusion_pytorch_model.safetensors" in stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("metadata", "expected"),
    [("", "lists no images"), ('{"file_name": "a.png", "text": "x"}\nnot json\n', "line 2")],
    ids=["empty", "not-json"],
)
def test_a_bad_image_folder_is_refused(finished_run, tmp_path, metadata, expected):
    data = tmp_path / "data"
    data.mkdir()
    (data / "metadata.jsonl").write_text(metadata)
    stderr = _refused(finished_run, "data=imagefolder", f"data.path={data}", "vae=pixel", "data.resolution=16",
                      into=tmp_path / "new")  # fmt: skip
    assert "metadata.jsonl" in stderr or "`data.path`" in stderr
    assert expected in stderr


@pytest.mark.slow
def test_a_missing_prompt_file_for_sampling_is_refused(finished_run, tmp_path):
    result = run_script(["scripts/sample.py", f"run_dir={finished_run}", f"prompt_file={tmp_path / 'nope.txt'}",
                         f"out_dir={tmp_path / 'out'}"])  # fmt: skip
    assert result.returncode == 2 and "no such file" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_unwritable_run_folder_is_refused_before_anything_is_written(finished_run, tmp_path):
    blocker = tmp_path / "a_file"  # as root no permission bit stops a write; a file where a folder must be does
    blocker.write_text("")
    stderr = _refused(finished_run, into=blocker / "run")
    assert "`hydra.run.dir`" in stderr and f"{blocker} is a file" in stderr and "To fix it" in stderr


@pytest.mark.slow
def test_the_metrics_of_a_refused_resume_are_kept(finished_run):
    records = [json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]


# Run folders and resumes (issue 17)


@pytest.mark.slow
def test_resuming_with_other_data_or_objective_is_refused_listing_the_keys(finished_run):
    """A different experiment in the same folder must not continue the first one's weights; the refused attempt
    leaves config.yaml describing the run that is there."""
    stderr = _refused(finished_run, "trainer.resume=latest", "trainer.max_steps=4", "data.length=300",
                      "diffusion.objective=epsilon", "optim.lr=0.01")  # fmt: skip
    assert "data.length (256 -> 300)" in stderr and "diffusion.objective ('v_prediction' -> 'epsilon')" in stderr
    assert "optim.lr" not in stderr.partition("Invalid config")[2]  # a change of how, not what, is trained


@pytest.mark.slow
def test_resuming_with_another_number_of_processes_is_refused(finished_run, tmp_path):
    copy = tmp_path / "checkpoint-2"
    shutil.copytree(finished_run / "checkpoints" / "checkpoint-2", copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "world_size": 2}))
    stderr = _refused(finished_run, f"trainer.resume={copy}", "trainer.max_steps=4", into=tmp_path / "new")
    assert "written by 2 processes and this run has 1" in stderr and "--num_processes 2" in stderr


# The command line


@pytest.mark.slow
def test_cli_reports_a_bad_value_without_a_traceback_before_building_models():
    result = run_script(["train.py", "+experiment=shapes", "trainer.mixed_precision=fp8"], timeout=120)
    assert result.returncode == 2
    assert "trainer.mixed_precision" in result.stderr and "fp8" in result.stderr
    assert "auto, no, fp16, bf16" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Loading weights" not in result.stderr  # nothing was built


@pytest.mark.slow
def test_cli_reports_a_type_error_naming_the_key():
    result = run_script(["train.py", "trainer.batch_size=many"], timeout=120)
    assert result.returncode != 0
    assert "batch_size" in result.stderr and "many" in result.stderr
