"""Checkpoint logic in-process (``training/state/checkpoint.py``, ``checkpoint_manifest.py``, ``checkpoint_errors.py``):
the LR schedule continues on another number of processes, old checkpoints included; an EMA turned on at a resume starts
from the restored weights; a launch that cannot read a checkpoint is told which can; a re-save killed between its two
renames keeps the previous copy. (``tests/e2e/test_fsdp.py`` and ``test_checkpoint.py`` launch the same cases with
several processes.)"""

import dataclasses
import json
import math

import pytest
import torch
from accelerate import Accelerator, PartialState
from diffusers.optimization import get_scheduler

from dit_trainer.components.freeze import trainable_parameters
from dit_trainer.config import ASSETS_DIR, TrainConfig
from dit_trainer.config.schema import OptimConfig, TrainerConfig
from dit_trainer.errors import ConfigError
from dit_trainer.runs.run_folder import LORA_WEIGHTS, MANIFEST, list_checkpoints, remove_unfinished_writes
from dit_trainer.training.optim import build_lr_scheduler
from dit_trainer.training.state.checkpoint import Checkpointer
from dit_trainer.training.state.checkpoint_manifest import (
    ResumeRules,
    WrittenBy,
    check_launch,
    schedule_in_updates,
    written_by,
)
from dit_trainer.training.state.ema import FusedEMA
from dit_trainer.training.state.training_state import TrainingState
from tests.conftest import build_tiny_transformer, one_paragraph

KINDS = ("constant_with_warmup", "constant", "linear", "cosine", "cosine_with_restarts", "polynomial")  # fmt: skip


def schedule_cfg(kind: str, warmup: int, steps: int) -> TrainConfig:
    return TrainConfig(optim=OptimConfig(lr_schedule=kind, warmup_steps=warmup), trainer=TrainerConfig(max_steps=steps))


def old_scheduler_state(kind: str, warmup: int, steps: int, updates: int, processes: int, per_step: int = 1) -> dict:
    """The scheduler state a checkpoint of ``processes`` held before the schedule counted updates: lengths scaled by
    the process count, and accelerate stepping it once per process on each update."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    scheduler = get_scheduler(kind, optimizer, num_warmup_steps=warmup * processes,
                              num_training_steps=steps * per_step * processes)  # fmt: skip
    for _ in range(updates * processes):
        optimizer.step()
        scheduler.step()
    return scheduler.state_dict()


def lrs(scheduler, updates: int) -> list[float]:
    """The LR after each of ``updates`` steps, as the update applies them (one step per update)."""
    values, optimizer = [], getattr(scheduler, "scheduler", scheduler).optimizer  # accelerate's wrapper, or diffusers'
    for _ in range(updates):
        optimizer.step()
        scheduler.step()
        values.append(scheduler.get_last_lr()[0])
    return values


def same(one: list[float], other: list[float]) -> bool:
    return len(one) == len(other) and all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(one, other))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("per_step", [1, 3])  # GRPO: several updates per step
def test_an_old_schedule_state_of_8_processes_continues_as_the_uninterrupted_run(kind, per_step):
    """Every schedule kind: 100 steps, preempted at step 40 on 8 processes, resumed (in updates since)."""
    cfg, updates = schedule_cfg(kind, 10, 100), 40 * per_step
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    straight = lrs(build_lr_scheduler(cfg.optim, optimizer, 100 * per_step), 100 * per_step)
    resumed = build_lr_scheduler(cfg.optim, optimizer, 100 * per_step)
    old = old_scheduler_state(kind, 10, 100, updates, processes=8, per_step=per_step)
    resumed.load_state_dict(schedule_in_updates(old, WrittenBy("ddp", 8, schedule_in_updates=False)))
    assert resumed.state_dict()["last_epoch"] == updates
    assert same(lrs(resumed, 60 * per_step), straight[updates:])


def tiny_run(tmp_path, kind: str, ema_decay: float = 0.0, groups: int = 1) -> tuple[Accelerator, Checkpointer, object]:
    """A prepared tiny DiT, its optimizer (in ``groups`` parameter groups) and the schedule of ``kind`` (10,000
    steps, 500 of warm-up), and its checkpointer, as ``assemble.py`` wires them."""
    accelerator, cfg = Accelerator(cpu=True, step_scheduler_with_optimizer=False), schedule_cfg(kind, 500, 10_000)
    dit = build_tiny_transformer()
    weights = list(dit.parameters())
    optimizer = torch.optim.AdamW([{"params": weights[i::groups]} for i in range(groups)], lr=1e-3)
    scheduler = build_lr_scheduler(cfg.optim, optimizer, cfg.trainer.max_steps)
    dit, optimizer, scheduler = accelerator.prepare(dit, optimizer, scheduler)
    parameters = trainable_parameters(accelerator.unwrap_model(dit).transformer)
    ema = FusedEMA(parameters, decay=ema_decay) if ema_decay else None
    state, config = TrainingState(torch.Generator()), dataclasses.asdict(cfg)
    checkpointer = Checkpointer(accelerator, tmp_path / "checkpoints", state, ema, None, ResumeRules(config=config),
                                lr_scheduler=scheduler, parameters=parameters)  # fmt: skip
    return accelerator, checkpointer, scheduler


def as_written_by(checkpoint, processes: int, old_format: bool) -> None:
    """Make ``checkpoint``'s manifest say it was written by ``processes`` DDP processes (before the schedule was
    counted in updates: without ``lr_schedule_unit``)."""
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    manifest.update(world_size=processes, launch="ddp")
    if old_format:
        del manifest["lr_schedule_unit"]
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("kind", ["linear", "cosine"])
@pytest.mark.parametrize("old_format", [True, False], ids=["old_format", "new_format"])
def test_a_10000_step_run_preempted_at_5000_on_8_processes_resumes_its_schedule(tmp_path, kind, old_format):
    """The audit's case, through a real checkpoint and ``Checkpointer.restore``: 10,000 steps preempted at 5,000 on
    8 GPUs and resumed on 4. Counted in processes x updates (the old format) the restored schedule trained every
    remaining step of ``linear`` at LR 0; now the schedule counts updates, which the number of processes after the
    resume does not change (the update steps it once per update), and an old state is converted at load."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    straight = lrs(build_lr_scheduler(schedule_cfg(kind, 500, 10_000).optim, optimizer, 10_000), 10_000)
    _, writer, scheduler = tiny_run(tmp_path, kind)
    if old_format:
        scheduler.load_state_dict(old_scheduler_state(kind, 500, 10_000, 5000, processes=8))
    else:
        lrs(scheduler, 5000)
    checkpoint = writer.save(5000)
    as_written_by(checkpoint, 8, old_format)

    _, reader, resumed = tiny_run(tmp_path, kind)
    assert reader.restore("latest") == checkpoint
    assert resumed.state_dict()["last_epoch"] == 5000
    remaining = lrs(resumed, 5000)
    assert same(remaining, straight[5000:]) and max(remaining) > 1e-4


def test_a_full_checkpoint_resumed_by_a_lora_run_is_refused_naming_both(tmp_path):
    """A LoRA run finds no adapter in a whole-DiT checkpoint (nor the reverse; it said so as an unreadable file):
    refused first, as allowing the config change would not make it load."""
    accelerator, writer, _ = tiny_run(tmp_path, "constant")
    checkpoint = writer.save(2)
    config = writer.rules.config
    changed = ResumeRules(weights=LORA_WEIGHTS, config={**config, "lora": {**config["lora"], "enabled": True}})
    reader = Checkpointer(accelerator, writer.checkpoints_dir, TrainingState(torch.Generator()), None, None, changed)
    with pytest.raises(ConfigError, match=r"holds the whole DiT \(`transformer/`\).*trains LoRA adapters") as refused:
        reader.restore(str(checkpoint))  # before the config change is refused: allowing it would not help
    assert "`lora.enabled=false`" in one_paragraph(refused.value, "trainer.resume")


def test_an_ema_turned_on_at_a_resume_starts_from_the_restored_weights(tmp_path):
    """A checkpoint trained without EMA has no ``transformer_ema/``: the EMA of the resumed run is the restored
    weights, not the freshly built model's, and not a failed load."""
    _, writer, _ = tiny_run(tmp_path, "constant")
    with torch.no_grad():
        for parameter in writer.parameters:
            parameter.add_(1.0)  # trained: other weights than a fresh build's
    trained = [parameter.detach().clone() for parameter in writer.parameters]
    checkpoint = writer.save(2)
    assert not (checkpoint / "transformer_ema").exists()

    _, reader, _ = tiny_run(tmp_path, "constant", ema_decay=0.99)
    assert not torch.equal(reader.ema.shadow_params[0], trained[0])
    assert reader.restore("latest") == checkpoint
    assert all(torch.equal(p, t) for p, t in zip(reader.parameters, trained, strict=True))
    assert all(torch.equal(s, t) for s, t in zip(reader.ema.shadow_params, trained, strict=True))
    assert reader.ema.optimization_step == 0


def test_an_ema_decay_changed_at_a_resume_is_the_one_that_averages(tmp_path):
    """The banner names `trainer.ema_decay` as changed; the checkpoint's counters must not put the old one back."""
    _, writer, _ = tiny_run(tmp_path, "constant", ema_decay=0.9)
    writer.ema.step(writer.parameters)
    checkpoint = writer.save(1)
    _, reader, _ = tiny_run(tmp_path, "constant", ema_decay=0.2)
    assert reader.restore("latest") == checkpoint
    assert reader.ema.decay == 0.2 and reader.ema.optimization_step == writer.ema.optimization_step


def test_an_optimizer_of_other_parameter_groups_is_refused_without_blaming_the_checkpoint(tmp_path):
    """``optim.weight_decay`` turned on at a resume of a learned-variance DiT gives AdamW another group: the
    checkpoint is fine, the optimizer is another (not a reason to fall back to an older checkpoint)."""
    _, writer, _ = tiny_run(tmp_path, "constant")
    writer.save(2)
    _, reader, _ = tiny_run(tmp_path, "constant", groups=2)
    with pytest.raises(ConfigError) as caught:
        reader.restore("latest")
    message = one_paragraph(caught.value, "trainer.resume")
    assert "optimizer state does not fit the configured optimizer" in message and "from a copy" not in message


def test_a_sharded_checkpoint_is_refused_without_fsdp_naming_the_launch_that_reads_it(tmp_path):
    """Written before the manifest said how: ``pytorch_model_fsdp_0/`` shows FSDP. The paragraph says the checkpoint
    is intact and names the launch config; it never advises restoring checkpoints from a copy."""
    checkpoint = tmp_path / "checkpoint-4"
    (checkpoint / "pytorch_model_fsdp_0").mkdir(parents=True)
    written = written_by(checkpoint, {"world_size": 2})
    assert written == WrittenBy("fsdp", 2, schedule_in_updates=False)
    assert written_by(tmp_path, {"world_size": 2}).launch == "ddp" and written_by(tmp_path, {}).launch == "single"
    with pytest.raises(ConfigError) as caught:
        check_launch(checkpoint, written, Accelerator(cpu=True))
    message = one_paragraph(caught.value, "trainer.resume")
    assert "accelerate_configs/fsdp.yaml" in message and "intact" in message and "from a copy" not in message


def complete(folder, content: bytes = b"weights") -> None:
    """A folder that counts as a complete checkpoint: a manifest that matches its one file."""
    (folder / "transformer").mkdir(parents=True)
    (folder / "transformer" / "w.safetensors").write_bytes(content)
    (folder / MANIFEST).write_text(json.dumps({"step": 4, "files": {"transformer/w.safetensors": len(content)}}))


def test_a_resave_killed_between_its_two_renames_keeps_the_previous_copy(tmp_path):
    """Saving step N again sets ``checkpoint-N`` aside as ``.checkpoint-N.replaced``, then publishes the new copy.
    Killed between the two, the set-aside copy is the only one: restored at the next start. Beside a complete new
    copy it is removed; unfinished writes (``.partial``) always are."""
    PartialState(cpu=True)  # the logger's
    checkpoints = tmp_path / "checkpoints"
    complete(checkpoints / ".checkpoint-4.replaced", b"previous")
    complete(checkpoints / "checkpoint-2")
    complete(checkpoints / ".checkpoint-2.replaced", b"older")
    (checkpoints / ".checkpoint-6.partial").mkdir()
    remove_unfinished_writes(checkpoints)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    assert (checkpoints / "checkpoint-4" / "transformer" / "w.safetensors").read_bytes() == b"previous"
    assert (checkpoints / "checkpoint-2" / "transformer" / "w.safetensors").read_bytes() == b"weights"
    assert [p.name for p in list_checkpoints(checkpoints)] == ["checkpoint-2", "checkpoint-4"]


def _train_a_little(checkpointer: Checkpointer, scheduler, updates: int) -> None:
    """``updates`` AdamW updates of the tiny DiT on a made-up loss (AdamW's moments and the schedule move), and
    draws from the step's generator, as a run's steps do."""
    optimizer = getattr(scheduler, "scheduler", scheduler).optimizer
    for _ in range(updates):
        loss = sum((parameter.float() - 0.1).pow(2).sum() for parameter in checkpointer.parameters)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        torch.rand(3, generator=checkpointer.state.generator)
        checkpointer.state.step += 1


def _snapshot(checkpointer: Checkpointer, scheduler) -> dict:
    optimizer = getattr(scheduler, "scheduler", scheduler).optimizer
    moments = [state["exp_avg_sq"].clone() for state in optimizer.state_dict()["state"].values()]
    return {
        "weights": [parameter.detach().clone() for parameter in checkpointer.parameters],
        "moments": moments,
        "lr": scheduler.get_last_lr(),
        "step": checkpointer.state.step,
        "generator": checkpointer.state.generator.get_state(),
    }


def _same(one: dict, other: dict) -> bool:
    tensors = ("weights", "moments")
    equal = all(len(one[k]) == len(other[k]) and all(map(torch.equal, one[k], other[k])) for k in tensors)
    return (
        equal
        and one["lr"] == other["lr"]
        and one["step"] == other["step"]
        and torch.equal(one["generator"], other["generator"])
    )


def test_a_checkpoint_restores_weights_optimizer_schedule_counters_and_generator_exactly(tmp_path):
    """The round trip every resume rests on, in this process on a tiny DiT: a fresh build restores what was saved
    bit for bit, and its next updates are the writer's."""
    _, writer, writer_schedule = tiny_run(tmp_path, "linear")
    _train_a_little(writer, writer_schedule, 3)
    saved = _snapshot(writer, writer_schedule)
    checkpoint = writer.save(3)
    _train_a_little(writer, writer_schedule, 2)

    _, reader, reader_schedule = tiny_run(tmp_path, "linear")
    assert not _same(_snapshot(reader, reader_schedule), saved)
    assert reader.restore("latest") == checkpoint
    assert _same(_snapshot(reader, reader_schedule), saved)
    _train_a_little(reader, reader_schedule, 2)
    assert _same(_snapshot(reader, reader_schedule), _snapshot(writer, writer_schedule))


def changed(checkpointer: Checkpointer, section: str, **values) -> None:
    """``checkpointer``'s run configured with ``values`` in ``section`` (its resume rules and the config it writes)."""
    config = checkpointer.rules.config
    config = config | {section: config[section] | values}
    checkpointer.rules = dataclasses.replace(checkpointer.rules, config=config)


def test_a_resume_that_changes_the_model_is_refused_naming_the_key_unless_allowed(tmp_path):
    """What a checkpoint trained is part of it: a resume with another model section is refused in one paragraph
    naming the key and both values (nothing loaded), and goes on with ``trainer.allow_config_change=true``; a
    changed LR is not a change of what is trained."""
    _, writer, _ = tiny_run(tmp_path, "linear")
    writer.save(2)
    _, reader, _ = tiny_run(tmp_path, "linear")
    layers = reader.rules.config["model"]["num_layers"]
    changed(reader, "model", num_layers=layers + 1)
    with pytest.raises(ConfigError) as caught:
        reader.restore("latest")
    message = one_paragraph(caught.value, "trainer.resume")
    assert f"model.num_layers ({layers} -> {layers + 1})" in message and reader.state.step == 0

    reader.rules = dataclasses.replace(reader.rules, allow_config_change=True)
    assert reader.restore("latest") is not None
    _, other_lr, _ = tiny_run(tmp_path, "linear")
    changed(other_lr, "optim", lr=1e-5)
    assert other_lr.restore("latest") is not None


def test_a_checkpoint_of_a_moved_checkout_resumes_with_this_installs_shipped_vae(tmp_path):
    """The checkpoint records the shipped VAE by the path of the checkout that trained it; once that checkout has
    moved, the same VAE of this install is no change of model (it was refused as one). Another VAE still is."""
    _, writer, _ = tiny_run(tmp_path, "linear")
    shipped = str(ASSETS_DIR / "shapes_vae")
    gone = "/gone/dit_trainer/assets/shapes_vae"
    changed(writer, "vae", pretrained=gone)
    writer.save(2)
    _, reader, _ = tiny_run(tmp_path, "linear")
    changed(reader, "vae", pretrained=shipped)
    assert reader.restore("latest") is not None
    _, other, _ = tiny_run(tmp_path, "linear")
    changed(other, "vae", pretrained=str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        other.restore("latest")
    assert f"vae.pretrained ('{shipped}' -> '{tmp_path}')" in str(caught.value)


def test_a_checkpoint_resumes_on_another_base_only_when_allowed(tmp_path):
    """A LoRA checkpoint's base (its fingerprint, ``hub.weights_fingerprint``) is part of what it trained: another
    is refused unless the change is allowed; a checkpoint or a run that cannot say it is not compared."""
    _, writer, _ = tiny_run(tmp_path, "linear")
    writer.rules = dataclasses.replace(writer.rules, base_weights="aaaa")
    checkpoint = writer.save(2)
    _, reader, _ = tiny_run(tmp_path, "linear")
    reader.rules = dataclasses.replace(reader.rules, base_weights="bbbb")
    with pytest.raises(ConfigError) as caught:
        reader.restore("latest")
    message = one_paragraph(caught.value, "trainer.resume")
    assert "fingerprint aaaa -> bbbb" in message and "`model.revision`" in message
    for rules in ({"base_weights": "bbbb", "allow_config_change": True}, {"base_weights": None}):
        _, reader, _ = tiny_run(tmp_path, "linear")
        reader.rules = dataclasses.replace(reader.rules, **rules)
        assert reader.restore("latest") == checkpoint
