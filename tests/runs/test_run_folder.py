"""What a run folder holds (``run_folder.py``): links planted where the trainer writes are refused before anything
is written through them; a damaged checkpoint is told apart from the complete ones, with why."""

import json
import logging

import pytest
import torch
from safetensors.torch import save_file

from dit_trainer.errors import ConfigError
from dit_trainer.runs.run_folder import (
    MANIFEST,
    find_checkpoint,
    incomplete_checkpoints,
    list_checkpoints,
    refuse_links,
    resolve_checkpoint,
    same_own_weights,
)
from tests.conftest import one_paragraph


@pytest.mark.parametrize(
    "planted", ["train.log", ".lock", ".hydra/config.yaml", "samples/step_0000100.png", "image_sizes/0123abcd.json"]
)
def test_a_link_where_the_trainer_writes_is_refused_and_its_target_left_alone(tmp_path, planted):
    run_dir, victim = tmp_path / "run", tmp_path / "notes.txt"
    victim.write_text("mine")
    for folder in (".hydra", "samples", "wandb", "image_sizes"):
        (run_dir / folder).mkdir(parents=True)
    (run_dir / "wandb" / "latest-run").symlink_to(run_dir / "wandb")  # W&B's own link is W&B's business
    refuse_links(run_dir)
    refuse_links(tmp_path / "not_yet_made")
    (run_dir / planted).symlink_to(victim)
    with pytest.raises(ConfigError) as caught:
        refuse_links(run_dir)
    assert f"({planted} -> {victim})" in one_paragraph(caught.value, "hydra.run.dir")
    assert victim.read_text() == "mine"


def two_checkpoints(checkpoints):
    """checkpoint-2 and checkpoint-4, each a 4-byte weights file that its manifest lists."""
    for step in (2, 4):
        folder = checkpoints / f"checkpoint-{step}"
        (folder / "transformer").mkdir(parents=True)
        (folder / "transformer" / "weights.safetensors").write_bytes(b"1234")
        (folder / MANIFEST).write_text(json.dumps({"files": {"transformer/weights.safetensors": 4}}))
    return checkpoints


def test_a_checkpoint_missing_a_file_is_listed_as_incomplete_with_why(tmp_path):
    """``latest`` passes over a damaged checkpoint: the resume warns with these reasons rather than say nothing."""
    checkpoints = two_checkpoints(tmp_path / "checkpoints")
    (checkpoints / "checkpoint-4" / "transformer" / "weights.safetensors").unlink()
    assert list_checkpoints(checkpoints) == [checkpoints / "checkpoint-2"]
    assert incomplete_checkpoints(checkpoints) == {
        checkpoints / "checkpoint-4": "transformer/weights.safetensors is missing"
    }


def test_latest_refuses_a_folder_whose_checkpoints_are_all_damaged_and_starts_afresh_in_one_with_none(tmp_path):
    """A fresh start would write over the damaged checkpoints (whose weights may be intact): it started from step
    0 with a warning that the folder held no checkpoint, and replaced checkpoint-4 at step 4."""
    checkpoints = two_checkpoints(tmp_path / "checkpoints")
    for step in (2, 4):
        (checkpoints / f"checkpoint-{step}" / "transformer" / "weights.safetensors").write_bytes(b"12")
    with pytest.raises(ConfigError) as caught:
        resolve_checkpoint("latest", checkpoints)
    message = one_paragraph(caught.value, "trainer.resume")
    assert "none of them complete (checkpoint-2: transformer/weights.safetensors has 2 bytes" in message
    assert "`hydra.run.dir`" in message
    assert resolve_checkpoint("latest", tmp_path / "new" / "checkpoints") is None  # a requeued first attempt


def test_the_scripts_find_a_checkpoint_by_name_and_refuse_a_damaged_one_naming_a_complete_one(tmp_path, caplog):
    """sample.py, evaluate.py and export.py: `latest` says which damaged checkpoint it passed over, a damaged one
    asked for by path is one paragraph (not diffusers' traceback), and `checkpoint-2` names one of the run's own."""
    checkpoints = two_checkpoints(tmp_path / "checkpoints")
    (checkpoints / "checkpoint-4" / "transformer" / "weights.safetensors").write_bytes(b"12")
    with caplog.at_level(logging.WARNING):
        assert find_checkpoint(tmp_path, "latest") == checkpoints / "checkpoint-2"
    assert "checkpoint-4 is passed over" in caplog.text and "2 bytes where 4 were written" in caplog.text
    assert find_checkpoint(tmp_path, "checkpoint-2") == checkpoints / "checkpoint-2"
    with pytest.raises(ConfigError) as caught:
        find_checkpoint(tmp_path, str(checkpoints / "checkpoint-4"))
    message = one_paragraph(caught.value, "checkpoint")
    assert "not a complete checkpoint (transformer/weights.safetensors has 2 bytes" in message
    assert "`checkpoint=checkpoint-2`" in message
    with pytest.raises(ConfigError, match=r"nor the name of one in .*`checkpoint=latest`, `checkpoint=checkpoint-2`"):
        find_checkpoint(tmp_path, "checkpoint-9")


def test_a_runs_own_starting_weights_are_the_same_after_the_folder_moved(tmp_path):
    """An online run copied elsewhere records its own copy of the starting weights under the old path: a resume of
    the copy must not take it for another model (it was refused unless the change was allowed)."""
    run = tmp_path / "copy"
    current = str(run.resolve() / "init" / "transformer_ema")
    assert same_own_weights("/old/place/run/init/transformer_ema", current, run)
    assert not same_own_weights("/old/place/run/init/transformer", current, run)  # other weights
    assert not same_own_weights("/models/pixart/transformer_ema", current, run)  # not a run's own copy
    assert not same_own_weights("/old/place/run/init/transformer_ema", "/elsewhere/init/transformer_ema", run)


def test_a_run_continued_in_another_folder_starts_from_the_same_weights_in_its_own_copy(tmp_path):
    """``trainer.resume=RUN hydra.run.dir=NEW`` of an online run: NEW makes its own copy of RUN's starting weights,
    which was refused as another model (``RUN/init/transformer_ema -> NEW/init/transformer_ema``)."""
    run, new = tmp_path / "run", tmp_path / "new"
    weights = torch.nn.Linear(64, 64).state_dict()
    for folder, seed in ((run, 0), (new, 0), (tmp_path / "other", 1)):
        torch.manual_seed(seed)
        (folder / "init" / "transformer_ema").mkdir(parents=True)
        save_file({k: torch.randn_like(v) for k, v in weights.items()},
                  folder / "init" / "transformer_ema" / "diffusion_pytorch_model.safetensors")  # fmt: skip
    saved = str(run / "init" / "transformer_ema")
    assert same_own_weights(saved, str(new / "init" / "transformer_ema"), run)
    assert not same_own_weights(saved, str(tmp_path / "other" / "init" / "transformer_ema"), run)  # other weights
    assert not same_own_weights(saved, str(tmp_path / "missing" / "init" / "transformer_ema"), run)
