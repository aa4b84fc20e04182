"""Hydra's conventions on train.py's command line: tab completion works, ``--help`` lists only groups that can be used
and shows each field's description from the schema's comments, a value of the wrong type (``optim.lr=abc``) is one
paragraph and exit 2 before Hydra runs, so is a run folder that cannot be made, and a refused start leaves no run
folder behind."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from dit_trainer.config import RewardMonitorConfig, TrainConfig, TrainerConfig
from dit_trainer.config.command_line import check_command_line
from dit_trainer.config.field_docs import documented_yaml, field_docs
from dit_trainer.errors import ConfigError
from dit_trainer.runs.launch_folder import RunFolderCheck, discard_refused_start

from .conftest import CONFIG_DIR, REPO, run_script


def test_shell_completion_installs_a_script_that_completes_keys():
    installed = run_script(["train.py", "-sc", "install=bash"])
    assert installed.returncode == 0, installed.stderr
    assert "complete -o nospace -o default -F hydra_bash_completion python" in installed.stdout
    query = run_script(["train.py", "-sc", "query=bash"], env={"COMP_LINE": "python train.py optim.l"})
    assert "optim.lr=" in query.stdout.split()


def test_help_lists_the_usable_groups_and_each_fields_description():
    shown = run_script(["train.py", "+experiment=shapes", "--help"])
    assert shown.returncode == 0, shown.stderr
    groups, _, config = shown.stdout.partition("== Configuration groups ==")[2].partition("== Config ==")
    assert "\ndata: hf, imagefolder" in groups and "\naccelerate:" not in groups  # launch configs are not a group
    assert re.search(r"\n  batch_size: \d+  # per process; must be >= 1\n", config)  # the value, the schema's words
    assert "  # auto: bf16 on recent GPUs, fp16 + grad scaler on older ones" in config  # above a field: too long


def test_field_descriptions_are_the_comments_beside_each_field_and_its_rule():
    trainer = field_docs(TrainerConfig)
    assert trainer["batch_size"] == "per process; must be >= 1"
    assert trainer["reentrant_checkpointing"].startswith("torch's re-entrant variant (use_reentrant=True): it gives")
    assert trainer["reentrant_checkpointing"].endswith("Off: the non-re-entrant variant.")  # both lines above it
    assert "sample_seed" not in trainer  # no comment, no check
    assert trainer["seed"] == "must be in [0, 2**32)"  # no comment: its check alone
    assert field_docs(RewardMonitorConfig)["group_size"].startswith("G: images per prompt; ")  # on a call's first line
    values = OmegaConf.to_container(OmegaConf.structured(TrainConfig))
    assert yaml.safe_load(documented_yaml(values)) == values  # the comments never break the YAML


@pytest.mark.parametrize(
    ("argv", "words"),
    [(["optim.lr=abc"], "but it must be a number. To fix it, set e.g. `optim.lr=0.0001`"),
     (["trainer.max_steps=1.5"], "but it must be a whole number"),
     (["trainer.gradient_checkpointing=maybe"], "but it must be true or false"),
     (["trainer.sample_prompts=abc"], "but it must be a list"),
     (["reward.weights.clip_score=high"], "but it must be a number"),
     (["monitor.reward.guidance_scale=abc"], "or null. To fix it, set e.g. `monitor.reward.guidance_scale=3.0`"),
     (["-m", "optim.lr=1e-4,abc"], "`optim.lr` is 'abc'")],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_one_paragraph_before_hydra(argv, words):
    with pytest.raises(ConfigError) as caught:
        check_command_line(argv, CONFIG_DIR)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_values_hydra_takes_pass_the_type_check():
    check_command_line(
        ["optim.lr=1e-3", "trainer.max_steps=10", "trainer.gradient_checkpointing=yes", "validation.path=null",
         "optim.lr=${oc.env:LR,1e-4}", "data.buckets=[[32,32]]", "++optim.warmup_steps=0", "data=imagefolder",
         "data.mixture.0.weight=2",  # an experiment's mixture entry: the bare schema's list is empty
         "-m", "optim.lr=1e-4,1e-3"],
        CONFIG_DIR,
    )  # fmt: skip


def test_a_refused_start_exits_2_in_one_paragraph_and_leaves_no_run_folder(tmp_path):
    (tmp_path / "outputs" / "earlier").mkdir(parents=True)  # another run's folder, beside the refused one
    for value in ("optim.lr=abc", "trainer.max_steps=0"):  # refused before Hydra; after Hydra made the folder
        refused = subprocess.run([sys.executable, str(REPO / "train.py"), value], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=120)  # fmt: skip
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert refused.stderr.startswith("error: Invalid config: `") and refused.stderr.count("\n") == 1
        assert [path.name for path in (tmp_path / "outputs").rglob("*")] == ["earlier"]


def test_a_refused_start_keeps_a_folder_it_did_not_make_or_one_a_run_started_in(tmp_path, monkeypatch):
    """... and Hydra's record of how that folder's run was launched, as it was before the refused launch."""

    def start(run_dir, resume=None):
        hydra = {"run": {"dir": str(run_dir)}, "output_subdir": ".hydra"}
        RunFolderCheck().on_run_start(OmegaConf.create({"hydra": hydra, "trainer": {"resume": resume}}))
        (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)  # what Hydra writes before the job runs
        for name in ("config.yaml", "overrides.yaml"):
            (run_dir / ".hydra" / name).write_text("the launch's")
        return run_dir

    existing = tmp_path / "existing"
    existing.mkdir()
    discard_refused_start(start(existing))
    assert sorted(existing.iterdir()) == []  # no record of a launch that never ran
    (existing / ".hydra").mkdir()
    (existing / ".hydra" / "config.yaml").write_text("the run's")
    (existing / ".hydra" / "notes.txt").write_text("the user's")  # not Hydra's: neither read nor touched
    discard_refused_start(start(existing))
    record = {f.name: f.read_text() for f in (existing / ".hydra").iterdir()}
    assert record == {"config.yaml": "the run's", "notes.txt": "the user's"}
    # The folder as Hydra makes it (os.path.abspath, which Path.absolute is not): the record is found again.
    discard_refused_start(start(tmp_path / "elsewhere" / ".." / "existing"))
    assert {f.name: f.read_text() for f in (existing / ".hydra").iterdir()} == record
    (existing / "metrics.jsonl").write_text('{"step": 1}\n')
    stopped = start(existing, resume="latest")
    (existing / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')  # the launch trained, then stopped
    discard_refused_start(stopped)
    assert {f.read_text() for f in (existing / ".hydra").iterdir()} == {"the launch's", "the user's"}  # it stays
    started = start(tmp_path / "started")
    (started / "config.yaml").write_text("{}")
    discard_refused_start(started)
    monkeypatch.setenv("WORLD_SIZE", "2")  # its folder holds each process's failure record
    several = start(tmp_path / "several")
    discard_refused_start(several)
    assert existing.is_dir() and started.is_dir() and several.is_dir()
    monkeypatch.delenv("WORLD_SIZE")
    discard_refused_start(start(tmp_path / "outputs" / "day" / "time"))
    assert not (tmp_path / "outputs").exists()


def test_only_the_main_process_writes_hydras_record_of_the_launch(monkeypatch):
    """Each process of a launch runs Hydra: the others' records raced the main process's, and its putting the record
    back after a refused start."""
    record_on_the_main_process = runpy.run_path(str(REPO / "train.py"))["record_on_the_main_process"]
    given = ["trainer.max_steps=5", "hydra.output_subdir=record"]
    monkeypatch.setenv("RANK", "0")
    assert record_on_the_main_process(given) == given
    monkeypatch.setenv("RANK", "1")
    assert record_on_the_main_process(given) == ["trainer.max_steps=5", "hydra.output_subdir=null"]


def test_a_run_folder_that_cannot_be_made_where_permissions_allow_it_is_one_paragraph_and_exit_2(
    tmp_path, monkeypatch, capsys
):
    """A root-squashed NFS share passes the permission check, then refuses the folder: no traceback from Hydra."""

    def refused(run_dir):
        raise PermissionError(13, "Permission denied", str(run_dir))

    monkeypatch.setattr("dit_trainer.runs.launch_folder.hold_for_run", refused)
    run_dir = tmp_path / "share" / "run"
    with pytest.raises(SystemExit) as exited:
        RunFolderCheck().on_run_start(OmegaConf.create({"hydra": {"run": {"dir": str(run_dir)}}}))
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"error: Invalid config: `hydra.run.dir` is '{run_dir}', but the folder could not be made there (Permission "
        "denied). To fix it, point `hydra.run.dir` at a writable folder, e.g. `hydra.run.dir=/scratch/runs/NAME`.\n"
    )
