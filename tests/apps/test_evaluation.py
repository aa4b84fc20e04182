"""Judging a trained run (``evaluation.py``): a reward must be given when the run configures none; an evaluation
gets a folder of its own, never overwrites one, and what its arguments alone can tell is refused before any model
loads."""

import json

import pytest

from tests.conftest import digest


def test_evaluate_needs_a_reward_when_the_run_configures_none():
    from dit_trainer.apps.evaluation import evaluation_reward
    from dit_trainer.config import EvaluateConfig, RewardConfig
    from dit_trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="`weights`"):
        evaluation_reward(EvaluateConfig(run_dir="run"), RewardConfig())


def _evaluate(run_dir, *args: str) -> int:
    """scripts/evaluate.py's command line, in-process: two images of one prompt, one sampling step, from
    ``written_run``'s checkpoint."""
    from dit_trainer.apps.cli import run_cli
    from dit_trainer.apps.evaluation import evaluate_to_folder
    from dit_trainer.config import EvaluateConfig

    argv = [str(run_dir), f"checkpoint={run_dir / 'checkpoints' / 'checkpoint-1'}", "prompts=[a red circle]",
            "images_per_prompt=2", "steps=1", *args]  # fmt: skip
    return run_cli(lambda cfg: str(evaluate_to_folder(cfg)[0]), EvaluateConfig, argv, "usage: evaluate.py")


@pytest.fixture()
def no_model_loads(monkeypatch):
    """Loading the run fails the test: what is refused must be refused before."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("dit_trainer.apps.evaluation.load_run", refuse)


def test_each_evaluation_gets_a_folder_named_for_what_it_evaluated_and_is_never_repeated_over_it(
    written_run, capsys, monkeypatch
):
    from dit_trainer.apps.evaluation import evaluation_folder
    from dit_trainer.config import EvaluateConfig

    assert _evaluate(written_run) == 0
    (folder,) = (written_run / "eval").iterdir()
    assert folder.name.startswith("checkpoint-1-rewards-") and capsys.readouterr().out.strip() == str(folder)
    assert json.loads((folder / "report.json").read_text())["arguments"]["images_per_prompt"] == 2
    assert (folder / "grid.png").is_file()
    checkpoint = written_run / "checkpoints" / "checkpoint-1"
    others = [EvaluateConfig(run_dir=str(written_run), checkpoint=str(checkpoint), prompts=["a red circle"],
                             images_per_prompt=2, steps=1, **extra)
              for extra in ({"seed": 1}, {"metrics": ["rewards", "fid"]}, {"ema": False})]  # fmt: skip
    assert len({folder} | {evaluation_folder(cfg, checkpoint) for cfg in others}) == 4

    before = digest(written_run)
    monkeypatch.setattr("dit_trainer.apps.evaluation.load_run", lambda *a, **k: pytest.fail("a model was loaded"))
    assert _evaluate(written_run, "batch_size=1") == 2  # how many images are sampled at once changes nothing
    refusal = capsys.readouterr().err
    assert f"`out_dir` is '{folder}', but that default folder is this evaluation's" in refusal
    assert "(the same checkpoint and arguments), which was run before" in refusal
    assert digest(written_run) == before


def test_a_prompt_file_counts_by_what_it_holds_and_where_it_is(tmp_path, monkeypatch):
    """The default folder's digest took the prompt file's name as typed: the same name with other prompts (edited,
    or another working directory's file) was refused as an evaluation run before."""
    from dit_trainer.apps.evaluation import evaluation_arguments, evaluation_folder
    from dit_trainer.config import EvaluateConfig

    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-1"
    cfg = EvaluateConfig(run_dir=str(tmp_path / "run"), prompt_file="p.txt")
    folders = []
    for where, prompts in (("a", "a red circle\n"), ("a", "a green triangle\n"), ("b", "a green triangle\n")):
        (tmp_path / where).mkdir(exist_ok=True)
        (tmp_path / where / "p.txt").write_text(prompts)
        monkeypatch.chdir(tmp_path / where)
        folders.append(evaluation_folder(cfg, checkpoint))
    assert len(set(folders)) == 3
    recorded = evaluation_arguments(cfg, checkpoint)
    assert recorded["prompt_file"] == str(tmp_path / "b" / "p.txt") and recorded["prompts"] == ["a green triangle"]
    (tmp_path / "b" / "p.txt").write_text("a green triangle\n")  # as it was: the same evaluation
    assert evaluation_folder(cfg, checkpoint) == folders[-1]


@pytest.mark.usefixtures("no_model_loads")
def test_an_out_dir_that_cannot_take_the_report_or_missing_fid_features_are_refused_before_any_model_loads(
    written_run, tmp_path, capsys, monkeypatch
):
    import torchmetrics.utilities.imports as imports

    blocker = tmp_path / "a_file"
    blocker.write_text("mine")
    assert _evaluate(written_run, f"out_dir={blocker}") == 2
    assert f"{blocker} is a file" in capsys.readouterr().err and blocker.read_text() == "mine"
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "report.json").write_text("{}")
    assert _evaluate(written_run, f"out_dir={earlier}") == 2
    assert "already holds report.json" in capsys.readouterr().err and (earlier / "report.json").read_text() == "{}"
    monkeypatch.setattr(imports, "_TORCH_FIDELITY_AVAILABLE", False)
    assert _evaluate(written_run, "metrics=[fid]", f"out_dir={tmp_path / 'fid'}") == 2
    assert "`fid_features` is 'inception'" in capsys.readouterr().err and not (tmp_path / "fid").exists()
    assert _evaluate(written_run, "weights.moving_shapes_alignment=1.0", f"out_dir={tmp_path / 'clips'}") == 2
    assert "scores clips, and this run samples images" in capsys.readouterr().err  # it failed after sampling


@pytest.mark.usefixtures("no_model_loads")
def test_a_folder_that_holds_no_run_is_named_as_such_before_its_checkpoints_are_looked_for(tmp_path, capsys):
    """It used to read "`checkpoint` is 'latest', but FOLDER/checkpoints holds no checkpoint yet": train longer."""
    from dit_trainer.apps.cli import run_cli
    from dit_trainer.apps.evaluation import evaluate_to_folder
    from dit_trainer.config import EvaluateConfig

    missing = tmp_path / "no_run_here"
    assert run_cli(evaluate_to_folder, EvaluateConfig, [str(missing)], "usage: evaluate.py") == 2
    error = capsys.readouterr().err
    assert f"`run_dir` is '{missing}', but it holds no config.yaml" in error and "checkpoint" not in error
    assert not missing.exists()
