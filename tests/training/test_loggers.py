"""Loggers that follow their tools' conventions (``training/monitors/trackers.py``,
``training/monitors/tracker_media.py``): a tracker whose package is missing, and W&B online without credentials, are
refused before anything is built; ``WANDB_MODE`` decides W&B's mode when ``logger.mode`` is unset; a W&B run is named
after the run folder, grouped and tagged by the experiment, records the run folder's path, gets each prompt's images
with captions, a table of them and the final weights as an artifact. The offline run is read back record by record with
W&B's own protobuf messages."""

from __future__ import annotations

import importlib.util
import json
import logging
import struct
from pathlib import Path

import pytest
import wandb
from wandb.proto import wandb_internal_pb2

from dit_trainer.assemble import build_trainer
from dit_trainer.config import LoggerConfig
from dit_trainer.errors import ConfigError
from dit_trainer.training.monitors.trackers import check_trackers, which_wandb_run

from ..conftest import TINY_SHAPES, compose_config, read_metrics
from ..e2e.family_runs import train_in_process

PROMPTS = "[a red circle,a blue square]"
RUN = (
    "data.length=48", "trainer.batch_size=8", "conditioner.memo_size=64", "trainer.max_steps=2", "trainer.log_every=1",
    "logger=wandb", "logger.notes=first try", "logger.log_checkpoints=true", "trainer.checkpoint_every=1",
    "trainer.sample_every=2", f"trainer.sample_prompts={PROMPTS}", "validation.every_n_steps=2",
    "validation.split=0.25", "validation.timesteps=2", "monitor.reward.enabled=true", "monitor.reward.every_n_steps=2",
    f"monitor.reward.prompts={PROMPTS}", "monitor.reward.group_size=2",
)  # fmt: skip
LEVELDB_BLOCK, RECORD_HEADER = 32768, 7  # W&B's .wandb files are LevelDB-style logs of protobuf records


def wandb_records(run_dir: Path) -> list[wandb_internal_pb2.Record]:
    """The records of the run's offline file (what `wandb sync` uploads), read with W&B's own messages."""
    wandb.teardown()  # a run's finish() returns before W&B's service has written everything
    [path] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, position, chunk, records = path.read_bytes(), RECORD_HEADER, b"", []  # past the file's header
    while position + RECORD_HEADER <= len(data):
        if LEVELDB_BLOCK - position % LEVELDB_BLOCK < RECORD_HEADER:  # a block's padding
            position += LEVELDB_BLOCK - position % LEVELDB_BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + RECORD_HEADER])
        chunk += data[position + RECORD_HEADER : position + RECORD_HEADER + length]
        position += RECORD_HEADER + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            records.append(wandb_internal_pb2.Record.FromString(chunk))
            chunk = b""
    return records


def of_type(records: list, kind: str) -> list:
    return [getattr(record, kind) for record in records if record.WhichOneof("record_type") == kind]


@pytest.fixture(scope="module")
def wandb_run(tmp_path_factory) -> tuple[Path, list[str]]:
    """A 2-step run with `logger=wandb`, no `logger.mode` and WANDB_MODE=offline in the environment; sample grid,
    reward monitor and validation at step 2, a checkpoint at steps 1 and 2 (`logger.log_checkpoints`). Returns its
    folder and what it logged."""
    run_dir = tmp_path_factory.mktemp("runs") / "my-first-run"
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    package = logging.getLogger("dit_trainer")
    level = package.level
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("WANDB_MODE", "offline")
            train_in_process(run_dir, *RUN)
    finally:
        package.removeHandler(handler)
        package.setLevel(level)
    return run_dir, records


@pytest.mark.parametrize(("name", "missing"), [("tensorboard", {"tensorboard", "tensorboardX"}), ("wandb", {"wandb"})])
def test_a_missing_tracker_package_is_refused_before_anything_is_built(tmp_path, monkeypatch, name, missing):
    cfg = compose_config([*TINY_SHAPES, f"logger={name}"])
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda module, *args: None if module in missing else find_spec(module, *args)
    )
    with pytest.raises(ConfigError) as refused:
        build_trainer(cfg, tmp_path)
    assert f"`logger` is '{name}', but the {name} package is not installed" in str(refused.value)
    assert f"`pip install {name}`" in str(refused.value) and "`logger=none`" in str(refused.value)
    assert list(tmp_path.iterdir()) == []  # refused before the run folder was locked, read or written


@pytest.fixture()
def no_wandb_credentials(monkeypatch, tmp_path):
    """No WANDB_MODE, no API key, no netrc and no W&B settings files; W&B's settings are read afresh from this
    environment, and again from the restored one afterwards."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DISABLED", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.chdir(tmp_path)
    wandb.teardown()
    yield monkeypatch
    monkeypatch.undo()
    wandb.teardown()


def test_wandb_online_without_credentials_is_refused_before_anything_is_built(tmp_path, no_wandb_credentials):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as refused:
        build_trainer(compose_config([*TINY_SHAPES, "logger=wandb"]), run_dir)
    message = str(refused.value)
    assert "neither `logger.mode` nor `WANDB_MODE` is set" in message and "no W&B API key" in message
    assert "`wandb login`" in message and "`WANDB_MODE=offline`" in message
    assert not run_dir.exists()


def test_wandb_mode_follows_the_environment_unless_logger_mode_is_set(no_wandb_credentials):
    env = no_wandb_credentials
    env.setenv("WANDB_MODE", "offline")
    wandb.teardown()
    check_trackers(LoggerConfig(name="wandb"))  # offline: no credentials needed
    with pytest.raises(ConfigError, match="`logger.mode=online`"):
        check_trackers(LoggerConfig(name="wandb", mode="online"))  # the config's mode overrides WANDB_MODE
    env.setenv("WANDB_API_KEY", "k" * 40)
    check_trackers(LoggerConfig(name="wandb", mode="online"))  # credentials found (not checked online)


@pytest.mark.slow
def test_wandb_offline_from_the_environment_writes_a_named_grouped_run_with_the_run_folder(wandb_run):
    run_dir, _ = wandb_run
    records = wandb_records(run_dir)
    [run] = of_type(records, "run")
    assert (run.display_name, run.run_group, list(run.tags), run.notes) == ("my-first-run", "shapes", ["shapes"],
                                                                             "first try")  # fmt: skip
    config = {item.key: json.loads(item.value_json) for update in of_type(records, "config") for item in update.update}
    assert config["run_dir"] == str(run_dir.resolve())


@pytest.mark.slow
def test_wandb_gets_each_prompts_images_with_captions_a_table_and_the_final_weights(wandb_run):
    run_dir, _ = wandb_run
    records = wandb_records(run_dir)
    history = {"/".join(item.nested_key) or item.key: item.value_json for row in of_type(records, "history")
               for item in row.item}  # fmt: skip
    for key in ("samples/00 a red circle", "samples/01 a blue square", "rewards/00 a red circle"):
        assert f"{key}/captions" in history, sorted(history)
    assert json.loads(history["samples/00 a red circle/captions"]) == [f"seed {seed}" for seed in range(4)]
    reward = next(r for r in read_metrics(run_dir) if "reward/mean" in r)
    captions = json.loads(history["rewards/00 a red circle/captions"])
    assert len(captions) == 2 and all(
        caption.startswith(("seed 0, reward ", "seed 1, reward ")) for caption in captions
    )
    assert reward["step"] == 2
    tables = [a for a in of_type(records, "artifact") if a.type == "run_table"]
    assert {json.loads(history[f"{key}/table/_type"]) for key in ("samples", "rewards")} == {"table-file"}
    assert tables, "the tables are logged (as W&B's run_table artifacts)"
    models = [a for a in of_type(records, "artifact") if a.type == "model"]  # logger.log_checkpoints: each one
    assert {a.name for a in models} == {f"model-{of_type(records, 'run')[0].run_id}"}
    assert [set(a.aliases) - {"latest"} for a in models] == [{"step-1"}, {"step-2", "final"}]
    assert all("diffusion_pytorch_model.safetensors" in {e.path for e in a.manifest.contents} for a in models)


@pytest.mark.slow
def test_the_run_logs_its_banner_and_writes_its_summary(wandb_run):
    run_dir, logged = wandb_run
    [banner] = [message for message in logged if "Starting the run:" in message]
    assert f"Run folder   {run_dir.resolve()}" in banner and "Precision    fp32 (auto:" in banner
    assert "Data         36 items (+ 12 validation images held out) at 32 px; 4 steps per epoch" in banner
    assert f"W&B offline in {run_dir / 'wandb'}" in banner
    metrics = read_metrics(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    last = metrics[-1]
    assert summary["status"] == "completed" and summary["steps"] == 2 and summary["final_loss"] == last["loss"]
    assert summary["final_val_loss"] == last["val/loss"] == summary["best_val_loss"]["value"]
    assert summary["final_reward"] == {"step": 2, "value": last["reward/mean"]}
    assert summary["weights"] == str(Path("checkpoints/checkpoint-2/transformer_ema"))
    [closing] = [line for line in logged if "(summary.json)" in line]
    assert "Trained 2 steps in " in closing and "val loss" in closing and "reward" in closing


@pytest.mark.parametrize(
    ("mode", "resume", "continued"),
    [("online", "latest", True),  # the newest checkpoint: the steps logged again are the same values
     ("online", "/runs/a/checkpoints/checkpoint-2", False),  # maybe older: W&B would drop the new branch's steps
     ("offline", "latest", False),  # `wandb sync` of two offline folders of one id keeps only the last one's
     ("online", None, False)],  # a fresh run
)  # fmt: skip
def test_a_run_resumed_online_from_its_newest_checkpoint_continues_its_wandb_run(tmp_path, mode, resume, continued):
    first = which_wandb_run(LoggerConfig(name="wandb", mode=mode), tmp_path, None)
    again = which_wandb_run(LoggerConfig(name="wandb", mode=mode), tmp_path, resume)
    assert (again == {"id": first["id"], "resume": "allow"}) is continued
    assert (tmp_path / "wandb_run_id").read_text() == again["id"]  # the run the next resume continues
