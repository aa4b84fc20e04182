"""The training loop (``training/trainer.py``): a step's optimizer update sees the gradients clipped to
``optim.max_grad_norm`` by the trainer's own update path, the gradient check before the first step runs on a few
rows, a dropped trainer leaves nothing alive, and a closed one gives its run folder back."""

import gc
import os
import signal
import threading
import weakref

import pytest
import torch
import wandb

from dit_trainer.assemble import build_trainer
from dit_trainer.errors import ConfigError
from dit_trainer.runs.run_folder import list_checkpoints
from dit_trainer.training.monitors.monitors import Monitor, MonitorFailed
from dit_trainer.training.preflight import PREFLIGHT_ROWS

from ..conftest import (
    TINY_SHAPES,
    compose_config,
    digest,
    one_paragraph,
    read_metrics,
    reset_accelerate_state,
    rows_trained_in_a_step,
)
from ..data.files import image_folder, png_bytes


@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e6, 0.0])
def test_the_optimizer_steps_on_gradients_clipped_to_max_grad_norm(tmp_path, max_grad_norm):
    """The trainer clips (its own path, not accelerate's) and returns the norm before clipping: the optimizer sees
    min(norm, max_grad_norm), and untouched gradients when the norm is under the limit or clipping is off."""
    cfg = compose_config([*TINY_SHAPES, "monitor.reward.enabled=false", f"optim.max_grad_norm={max_grad_norm}"])
    trainer = build_trainer(cfg, tmp_path)
    seen = []
    trainer.update.optimizer.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(
            torch.nn.utils.get_total_norm([p.grad for p in trainer.dit.parameters()])
        )
    )
    _, grad_norm = trainer.step(trainer.step.batches())
    expected = min(grad_norm.item(), max_grad_norm or float("inf"))
    assert grad_norm.item() > 1e-3 and seen[0].item() == pytest.approx(expected, rel=1e-5)


def test_a_dropped_trainer_frees_its_model_after_the_gradient_check(tmp_path):
    """The check before the first step hooked the DiT's outputs, and each hook held its call, which held the graph
    node that held the hook: a cycle through autograd's C++ nodes that the garbage collector cannot see, so every
    trainer built after another (the GPU check's rows, sweeps, tests) carried the earlier ones' models."""
    cfg = compose_config([*TINY_SHAPES, "monitor.reward.enabled=false"])
    trainer = build_trainer(cfg, tmp_path)
    trainer.step(trainer.step.batches())  # the first step runs the gradient check
    model = weakref.ref(trainer.dit)
    del trainer
    gc.collect()
    assert model() is None


def test_a_closed_trainer_gives_its_run_folder_and_its_tracker_back(tmp_path, monkeypatch):
    """A trainer built from Python and never fitted held its folder's lock (and the lock's heartbeat thread) and its
    W&B run until the process exited: a second build into the folder was refused as a live run's."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg, running = compose_config([*TINY_SHAPES, "logger=wandb"]), set(threading.enumerate())
    with build_trainer(cfg, tmp_path) as trainer:
        assert (tmp_path / ".lock").exists() and wandb.run is not None
        heartbeats = [thread for thread in set(threading.enumerate()) - running if thread.name == "run-folder-lock"]
        assert len(heartbeats) == 1
    assert not (tmp_path / ".lock").exists() and wandb.run is None
    for heartbeat in heartbeats:
        heartbeat.join(timeout=5)
    assert not any(heartbeat.is_alive() for heartbeat in heartbeats)
    trainer.close()  # again: nothing left to give back
    again = build_trainer(cfg, tmp_path)  # the folder is free

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    again.accelerator.trackers[0].finish = full_disk  # a tracker that cannot finish: the folder is given back still
    with pytest.raises(OSError, match="No space left"):
        again.close()
    assert not (tmp_path / ".lock").exists()
    wandb.finish()


def test_the_gradient_check_runs_on_a_few_rows_and_the_step_on_the_whole_batch(tmp_path):
    """The check before the first step is eager even under ``trainer.compile``; on the whole batch it set the run's
    peak memory (DiT-XL/2 compiled at 256 on an H200: 110.5 GiB, against 80.2 on two rows)."""
    cfg = compose_config([*TINY_SHAPES, "monitor.reward.enabled=false", "trainer.batch_size=8"])
    assert rows_trained_in_a_step(build_trainer(cfg, tmp_path)) == [PREFLIGHT_ROWS, 8]


# Three steps, each logged, the validation loss at step 2: a monitor due where the run is cut.
THREE_VALIDATED_STEPS = [*TINY_SHAPES, "data.length=32", "trainer.batch_size=8", "trainer.max_steps=3",
                         "trainer.log_every=1", "trainer.sample_every=0", "validation.every_n_steps=2",
                         "validation.split=0.25"]  # fmt: skip


def logged(run_dir) -> list[dict]:
    """The run's metrics without its timings (seconds, images per second), which no two runs share."""
    return [{k: v for k, v in record.items() if "seconds" not in k and "per_sec" not in k}
            for record in read_metrics(run_dir)]  # fmt: skip


class AtStep(Monitor):
    """Runs ``action`` after ``step`` (and logs nothing)."""

    def __init__(self, context, step: int, action) -> None:
        super().__init__(context, every_n_steps=1)
        self.step, self.action = step, action

    def run(self, dit, step: int) -> dict[str, float]:
        if step == self.step:
            self.action()
        return {}


def preempt() -> None:
    os.kill(os.getpid(), signal.SIGUSR1)  # a scheduler's notice: the loop stops at the end of the next step


def run_out_of_memory() -> None:
    raise MemoryError("the reward model ran out of memory")  # as a reward model can


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")
def test_the_monitors_a_preemption_skipped_run_on_resuming_as_in_a_run_never_stopped(tmp_path):
    """A preemption's checkpoint is written before its step's monitors (the grace period is the checkpoint's): they
    run when the run resumes, so that step's line holds their readings and every logged value is the
    uninterrupted run's (a gold watch's best checkpoint and stop depend on them)."""
    overrides = THREE_VALIDATED_STEPS
    build_trainer(compose_config(overrides), tmp_path / "whole").fit()
    reset_accelerate_state()
    cut = build_trainer(compose_config(overrides), tmp_path / "cut")
    cut.monitors.append(AtStep(cut.monitors[0].context, 1, preempt))
    assert cut.fit().preempted and cut.state.step == 2
    assert [record["step"] for record in read_metrics(tmp_path / "cut")] == [1, 2]
    assert "val/loss" not in read_metrics(tmp_path / "cut")[-1]
    reset_accelerate_state()
    resumed = build_trainer(compose_config([*overrides, "trainer.resume=latest"]), tmp_path / "cut")
    resumed.fit()

    assert "val/loss" in logged(tmp_path / "whole")[1]
    assert logged(tmp_path / "cut") == logged(tmp_path / "whole")


@pytest.mark.slow
def test_a_failing_monitor_stops_the_run_after_its_step_s_checkpoint_and_the_resume_matches_a_run_never_stopped(
    tmp_path,
):
    """A monitor that raises stops the run (its error the cause of the stop's, which names the checkpoint and the
    command to continue), but only after its step's training is checkpointed with that step's monitors pending: the
    run continued once the cause is gone logs every value the uninterrupted run did (the validation loss of the
    failed step included)."""
    overrides = THREE_VALIDATED_STEPS
    build_trainer(compose_config(overrides), tmp_path / "whole").fit()
    reset_accelerate_state()
    cut = build_trainer(compose_config(overrides), tmp_path / "cut")
    cut.monitors.insert(0, AtStep(cut.monitors[0].context, 2, run_out_of_memory))
    with pytest.raises(MonitorFailed) as stop:
        cut.fit()
    assert isinstance(stop.value.__cause__, MemoryError)
    message = str(stop.value)
    assert "AtStep at step 2: MemoryError: the reward model ran out of memory" in message
    assert "checkpoint-2" in message and f"trainer.resume={tmp_path / 'cut'}" in message
    assert [path.name for path in list_checkpoints(tmp_path / "cut" / "checkpoints")] == ["checkpoint-2"]
    assert [record["step"] for record in read_metrics(tmp_path / "cut")] == [1, 2]
    reset_accelerate_state()
    build_trainer(compose_config([*overrides, "trainer.resume=latest"]), tmp_path / "cut").fit()
    assert logged(tmp_path / "cut") == logged(tmp_path / "whole")


def test_latest_in_a_folder_without_checkpoints_warns_that_it_starts_at_step_0(tmp_path, caplog):
    """A `trainer.resume=latest` without the run's `hydra.run.dir` trains from step 0 in a new folder: it was one
    INFO line, and the user believed the run resumed."""
    overrides = [*TINY_SHAPES, "data.length=32", "trainer.batch_size=8", "model.num_layers=1", "trainer.max_steps=1"]
    build_trainer(compose_config([*overrides, "trainer.resume=latest"]), tmp_path)
    warned = [record for record in caplog.records if "holds no checkpoint yet" in record.getMessage()]
    assert warned and warned[0].levelname == "WARNING" and "`trainer.resume=RUN`" in warned[0].getMessage()


def test_a_resume_past_max_steps_is_refused_and_changes_nothing_in_the_run_folder(tmp_path, monkeypatch):
    """It trained nothing, exited 0 and rewrote config.yaml (max_steps, a warm-up clipped to the shorter run) and
    summary.json with the shorter length. Refused before any model loads, as every check of a resume."""
    overrides = [*TINY_SHAPES, "data.length=32", "trainer.batch_size=8", "model.num_layers=1", "trainer.log_every=1",
                 "trainer.sample_every=0", "trainer.checkpoint_every=2"]  # fmt: skip
    build_trainer(compose_config([*overrides, "trainer.max_steps=4"]), tmp_path).fit()
    before = digest(tmp_path)
    reset_accelerate_state()
    monkeypatch.setattr("dit_trainer.assemble.build_components", lambda **_: pytest.fail("the models were built"))
    with pytest.raises(ConfigError) as caught:
        build_trainer(compose_config([*overrides, "trainer.max_steps=3", "trainer.resume=latest"]), tmp_path)
    message = one_paragraph(caught.value, "trainer.max_steps")
    assert "resumes at step 4 (checkpoint-4), past it" in message and "`trainer.max_steps=4` or more" in message
    assert digest(tmp_path) == before


def test_resuming_an_older_checkpoint_sets_the_abandoned_branch_aside(tmp_path):
    """Continued from checkpoint-2 of a run that reached 4, the run's later checkpoint and metrics are moved aside
    (kept): ``latest`` is then the new branch's, and pruning never takes the new checkpoints for older ones."""
    overrides = [*TINY_SHAPES, "data.length=32", "trainer.batch_size=8", "model.num_layers=1", "trainer.log_every=1",
                 "trainer.sample_every=0", "trainer.checkpoint_every=2"]  # fmt: skip
    build_trainer(compose_config([*overrides, "trainer.max_steps=4"]), tmp_path).fit()
    checkpoints = tmp_path / "checkpoints"
    reset_accelerate_state()
    older = f"trainer.resume={checkpoints / 'checkpoint-2'}"
    build_trainer(compose_config([*overrides, "trainer.max_steps=3", older]), tmp_path).fit()
    aside = checkpoints / "abandoned-after-2"
    assert [p.name for p in list_checkpoints(checkpoints)] == ["checkpoint-2", "checkpoint-3"]
    assert (aside / "checkpoint-4").is_dir() and [r["step"] for r in read_metrics(aside)] == [3, 4]
    assert [record["step"] for record in read_metrics(tmp_path)] == [1, 2, 3]
    reset_accelerate_state()
    resumed = build_trainer(compose_config([*overrides, "trainer.max_steps=4", "trainer.resume=latest"]), tmp_path)
    assert resumed.state.step == 3


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")
def test_a_log_step_after_a_resume_averages_the_steps_before_it_too(tmp_path):
    """Logged every 4 steps and preempted at step 6: step 8's loss (and its losses by timestep) average steps 5-8
    as the uninterrupted run's do, not only the 2 steps trained since the resume."""
    overrides = [*TINY_SHAPES, "data.length=32", "trainer.batch_size=8", "model.num_layers=1", "trainer.log_every=4",
                 "trainer.sample_every=0", "trainer.max_steps=8"]  # fmt: skip
    build_trainer(compose_config(overrides), tmp_path / "whole").fit()
    reset_accelerate_state()
    cut = build_trainer(compose_config(overrides), tmp_path / "cut")
    cut.monitors.append(AtStep(cut.monitors[0].context, 5, preempt))
    assert cut.fit().preempted and cut.state.step == 6
    reset_accelerate_state()
    build_trainer(compose_config([*overrides, "trainer.resume=latest"]), tmp_path / "cut").fit()

    whole = logged(tmp_path / "whole")
    assert [record["step"] for record in whole] == [4, 8] and any(key.startswith("loss/t_") for key in whole[1])
    assert logged(tmp_path / "cut") == whole


@pytest.mark.slow
def test_an_update_is_its_micro_batches_wherever_an_epoch_ends(tmp_path):
    """10 batches an epoch, 4 per update: accelerate's default would sync at the end of each epoch (micro-batch 2
    of update 3), ending that update early. Every update must make exactly one optimizer step."""
    overrides = [*TINY_SHAPES, "data.length=40", "trainer.batch_size=4", "model.num_layers=1", "trainer.max_steps=5",
                 "trainer.gradient_accumulation_steps=4", "trainer.sample_every=0", "trainer.checkpoint_every=0",
                 "monitor.reward.enabled=false", "validation.every_n_steps=0"]  # fmt: skip
    trainer = build_trainer(compose_config(overrides), tmp_path)
    trainer.fit()
    steps = {int(state["step"]) for state in trainer.update.optimizer.state.values()}
    assert steps == {5}


@pytest.mark.slow
def test_a_resume_on_a_folder_whose_images_changed_is_refused(tmp_path):
    """Images added under the same config move the held-out split (validation images would be trained on): the
    checkpoint records what the folder held, and a resume on more is refused unless the change is allowed."""
    rows = [{"file_name": f"{i}.png", "text": "a red square"} for i in range(16)]
    (tmp_path / "data").mkdir()
    folder = image_folder(tmp_path / "data", rows, {row["file_name"]: png_bytes() for row in rows})
    overrides = [*TINY_SHAPES, "data=imagefolder", f"data.path={folder}", "data.resolution=32", "data.num_workers=0",
                 "trainer.batch_size=4", "model.num_layers=1", "trainer.sample_every=0", "validation.every_n_steps=2",
                 "validation.split=0.25", "monitor.reward.enabled=false"]  # fmt: skip
    build_trainer(compose_config([*overrides, "trainer.max_steps=2"]), tmp_path / "run").fit()
    added = [{"file_name": f"{i}.png", "text": "a red square"} for i in range(16, 20)]
    image_folder(folder, rows + added, {row["file_name"]: png_bytes() for row in added})
    reset_accelerate_state()
    resumed = [*overrides, "trainer.max_steps=3", "trainer.resume=latest"]
    with pytest.raises(ConfigError, match=r"`trainer.resume`.*the data it was trained on changed since.*'entries': 16"):
        build_trainer(compose_config(resumed), tmp_path / "run")
    reset_accelerate_state()
    assert build_trainer(compose_config([*resumed, "trainer.allow_config_change=true"]), tmp_path / "run").state.step
