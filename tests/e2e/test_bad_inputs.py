"""The bad-input table through ``train.py`` and the scripts: each bad value, run folder, resume or data folder gets
one paragraph naming the problem and the fix (exit 2, no traceback), or is handled (exit 0: skipped, left out), and
nothing already written (a checkpoint, the metrics, an evaluation, a file a link points at) is modified."""

import json
import os
import shutil

import pytest

from ..conftest import QUIET, TINY_SHAPES, class_conditional, digest, read_metrics, run_here, run_script, train_here
from ..data.files import BUCKETS, photos_folder


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("bad_inputs") / "run"
    train_here(run_dir, "trainer.max_steps=2", *QUIET)
    return run_dir


def _owned(run_dir) -> dict[str, str]:
    """The digests of what a run owns in its folder (checkpoints, metrics, config; not Hydra's ``.hydra/``)."""
    return {k: v for k, v in digest(run_dir).items() if k.startswith(("checkpoints", "metrics", "config.yaml"))}


def _refused(run_dir, *overrides: str, into=None) -> str:
    """Run train.py with ``overrides`` into ``into`` (default: the finished run); it must exit 2 without a
    traceback and leave the finished run's files (checkpoints, metrics, config, and Hydra's record of how it was
    launched) as they were. Returns stderr."""
    before = _owned(run_dir), _hydra_record(run_dir)
    result = run_here(
        ["train.py", *TINY_SHAPES, f"hydra.run.dir={into or run_dir}", "trainer.sample_every=0", *overrides]
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert (_owned(run_dir), _hydra_record(run_dir)) == before
    return result.stderr


def _hydra_record(run_dir) -> dict[str, str]:
    """The digests of Hydra's record of how the run started (``.hydra/``: its config and overrides)."""
    return {k: v for k, v in digest(run_dir).items() if k.startswith(".hydra")}


@pytest.mark.slow
def test_a_fresh_run_over_a_finished_one_is_refused(finished_run):
    started = _hydra_record(finished_run)
    assert "already holds checkpoints" in _refused(finished_run, "trainer.max_steps=4", "optim.lr=0.5")
    assert _hydra_record(finished_run) == started  # refused before Hydra writes the new start's record over it


@pytest.mark.slow
def test_a_fresh_run_over_a_finished_one_whose_checkpoints_are_gone_keeps_its_metrics(finished_run, tmp_path):
    exported = tmp_path / "exported"  # its weights exported, then its checkpoints deleted
    shutil.copytree(finished_run, exported, ignore=shutil.ignore_patterns("checkpoints"))
    before = _owned(exported), _hydra_record(exported)
    stderr = _refused(finished_run, "trainer.max_steps=4", into=exported)
    assert "holds the metrics.jsonl of an earlier run" in stderr and "fresh `hydra.run.dir`" in stderr
    assert (_owned(exported), _hydra_record(exported)) == before


@pytest.mark.slow
def test_a_checkpoint_continued_in_a_folder_holding_another_run_is_refused(finished_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(finished_run, other)
    before = _owned(other), _hydra_record(other)
    checkpoint = finished_run / "checkpoints" / "checkpoint-2"
    stderr = _refused(finished_run, "trainer.max_steps=4", f"trainer.resume={checkpoint}", into=other)
    assert "a checkpoint of another folder" in stderr and "checkpoints up to checkpoint-2" in stderr
    assert (_owned(other), _hydra_record(other)) == before


@pytest.mark.slow
def test_resuming_from_a_folder_that_is_not_a_checkpoint_is_refused(finished_run, tmp_path):
    stderr = _refused(finished_run, "trainer.max_steps=4", f"trainer.resume={tmp_path}", into=tmp_path / "new")
    assert "`trainer.resume`" in stderr and "not a checkpoint folder" in stderr


@pytest.mark.slow
def test_resuming_a_checkpoint_of_another_model_shape_is_refused(finished_run, tmp_path):
    """Refused from the checkpoint's recorded config; with the change allowed, from the weights themselves."""
    checkpoint = finished_run / "checkpoints" / "checkpoint-2"
    stderr = _refused(finished_run, "model.num_layers=3", f"trainer.resume={checkpoint}", into=tmp_path / "new")
    assert "objective or reward fine-tuning: model.num_layers (2 -> 3)" in stderr
    assert "trainer.allow_config_change=true" in stderr
    stderr = _refused(finished_run, "model.num_layers=3", f"trainer.resume={checkpoint}",
                      "trainer.allow_config_change=true", into=tmp_path / "new")  # fmt: skip
    assert "its weights do not fit the configured model" in stderr and "config.yaml" in stderr


@pytest.mark.slow
def test_resuming_with_validation_turned_on_is_refused(finished_run, tmp_path):
    """Images the checkpoint trained on would become the held-out set."""
    checkpoint = finished_run / "checkpoints" / "checkpoint-2"
    stderr = _refused(finished_run, "validation.every_n_steps=2", "validation.split=0.25",
                      f"trainer.resume={checkpoint}", into=tmp_path / "new")  # fmt: skip
    assert "held-out split" in stderr and "validation.every_n_steps (0 -> 2)" in stderr


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
    [("", "lists no images"), ('{"file_name": "a.png", "text": "x"}\nnot json\n', "line 2"),
     ('{"file_name": "../a.png", "text": "x"}\n', "line 1 of metadata.jsonl names '../a.png', outside that folder")],
    ids=["empty", "not-json", "outside"],
)  # fmt: skip
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
    result = run_here(["scripts/sample.py", f"run_dir={finished_run}", f"prompt_file={tmp_path / 'nope.txt'}",
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


# Inputs that reach outside what the user gave, and what the config alone can tell (issue 30, items 10-16)


@pytest.mark.slow
def test_a_mixture_weight_that_is_not_finite_is_refused(finished_run, tmp_path):
    """Refused in a folder of the user's: Hydra's record of the launch and its job log are not left there."""
    mixture = "data.mixture=[{source:shapes,weight:inf},{source:shapes}]"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    assert "`data.mixture[0].weight` is inf" in _refused(finished_run, mixture, into=tmp_path / "mine")
    assert [path.name for path in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's"


@pytest.mark.slow
def test_an_fid_reference_of_one_image_is_refused_before_training(finished_run, tmp_path):
    fid = ["monitor.fid.enabled=true", "monitor.fid.features=vae", f"monitor.fid.cache_dir={tmp_path / 'fid'}"]
    stderr = _refused(finished_run, "validation.every_n_steps=2", "validation.split=0.001", *fid, into=tmp_path / "new")
    assert "`validation.split` is 0.001" in stderr and "1 readable validation image(s) give no covariance" in stderr
    assert read_metrics(tmp_path / "new") == []  # not one step trained


@pytest.mark.slow
def test_a_link_planted_where_the_trainer_writes_is_refused_and_its_target_kept(finished_run, tmp_path):
    victim, run_dir = tmp_path / "notes.txt", tmp_path / "new"
    victim.write_text("mine")
    run_dir.mkdir()
    (run_dir / "train.log").symlink_to(victim)
    stderr = _refused(finished_run, into=run_dir)
    assert f"holds links where the trainer writes (train.log -> {victim})" in stderr and victim.read_text() == "mine"


@pytest.mark.slow
def test_grpo_prompts_that_are_no_classes_are_refused_and_hidden_or_empty_folders_are_no_classes(
    finished_run, tmp_path
):
    from PIL import Image

    for folder in ("cat", "dog", ".ipynb_checkpoints", "empty"):
        (tmp_path / "data" / folder).mkdir(parents=True)
    for folder in ("cat", "dog", ".ipynb_checkpoints"):
        Image.new("RGB", (16, 16)).save(tmp_path / "data" / folder / "0.png")
    (tmp_path / "trained").mkdir()
    stderr = _refused(finished_run, *class_conditional(tmp_path / "data", "trainer.sample_prompts=[cat]"),
                      "trainer.method=grpo", f"model.pretrained={tmp_path / 'trained'}", "grpo.prompts=[cat,bird]",
                      into=tmp_path / "new")  # fmt: skip
    assert "`grpo.prompts` is ['bird']" in stderr and "(classes: cat, dog)" in stderr


@pytest.mark.slow
def test_a_mixture_with_a_lone_wide_image_and_files_that_are_not_regular_images_trains(tmp_path):
    """Handled: the wide image's share of an epoch rounds to no item and is left out (it crashed the batch plan);
    a FIFO, a folder named like an image and a link out of the folder are skipped as unreadable (the FIFO hung the
    loader, the link read a file the user never gave)."""
    from dit_trainer.data.sources.shapes import write_shapes_folder

    from ..data.files import png_bytes

    shapes = write_shapes_folder(tmp_path / "shapes", 40, [(32, 32)])
    photos = photos_folder(tmp_path / "photos", 40)
    (photos / "wide.png").write_bytes(png_bytes(size=(64, 24)))
    os.mkfifo(photos / "fifo.png")
    (photos / "dir.png").mkdir()
    (tmp_path / "secret.png").write_bytes(png_bytes())
    (photos / "link.png").symlink_to(tmp_path / "secret.png")
    with (photos / "metadata.jsonl").open("a") as metadata:
        for name in ("wide.png", "fifo.png", "dir.png", "link.png"):
            metadata.write(json.dumps({"file_name": name, "text": name}) + "\n")
    mixture = f"data.mixture=[{{source:imagefolder,path:{shapes},weight:3}},{{source:imagefolder,path:{photos}}}]"
    result = run_here(["train.py", *TINY_SHAPES, f"hydra.run.dir={tmp_path / 'run'}", mixture, BUCKETS, *QUIET,
                       "data.resolution=32", "data.num_workers=0", "trainer.batch_size=4", "trainer.max_steps=2",
                       "data.max_bad_fraction=0.5"])  # fmt: skip
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert [record["step"] for record in read_metrics(tmp_path / "run")] == [1, 2]


@pytest.mark.slow
def test_an_evaluation_into_a_file_is_refused_before_any_model_loads(finished_run, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("mine")
    result = run_script(["scripts/evaluate.py", str(finished_run), f"out_dir={blocker}"])
    assert result.returncode == 2 and "Traceback" not in result.stderr and "Loading weights" not in result.stderr
    assert f"`out_dir` is '{blocker}', but {blocker} is a file" in result.stderr and blocker.read_text() == "mine"


@pytest.mark.slow
def test_make_digits_without_scikit_learn_is_refused_and_leaves_no_folder(tmp_path):
    code = ("import runpy, sys\nsys.modules['sklearn.datasets'] = None\n"
            f"sys.argv = ['make_digits.py', {str(tmp_path / 'digits')!r}]\n"
            "sys.exit(runpy.run_path('scripts/make_digits.py', run_name='__main__'))")  # fmt: skip
    result = run_script(["-c", code])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "scikit-learn, which is not installed" in result.stderr and list(tmp_path.iterdir()) == []
