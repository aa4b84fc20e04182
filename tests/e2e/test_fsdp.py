"""FSDP2 through the trainer on 2 CPU processes (``accelerate_configs/fsdp_cpu.yaml``): the losses of DDP, sharded
checkpoints plus whole weights, an exact resume, a resume on another number of processes at the same LR (falling
back from a damaged checkpoint, and starting an EMA the checkpoint lacks), export and sampling of the result, a
checkpoint of the other kind (sharded or not) refused before any model loads, and GRPO sharded, with LoRA and fully
fine-tuned."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ..conftest import (
    CPU_PROCESSES,
    GRPO_PROMPTS,
    REPO,
    TINY_SHAPES,
    accelerate_launch,
    digest,
    free_port,
    read_metrics,
    run_here,
    run_script,
)
from .runs_in_turn import ended, launch_in_turn

# Cosine after 5 warm-up steps: an LR of its own at every step, which a resume must continue.
STEPS = ("trainer.log_every=1", "trainer.checkpoint_every=4", "trainer.sample_every=4", "optim.lr_schedule=cosine")
WEIGHTS = "diffusion_pytorch_model.safetensors"
FSDP_TOLERANCE = 1e-5  # FSDP2 reduce-scatters what DDP all-reduces: the sums differ in the last bits only


def fsdp_launch(processes: int = 2) -> list[str]:
    return ["-m", "accelerate.commands.launch", "--config_file", str(REPO / "accelerate_configs/fsdp_cpu.yaml"),
            "--num_processes", str(processes), "--main_process_port", str(free_port())]  # fmt: skip


def launch(launcher: list[str], run_dir: Path, *overrides: str, base: tuple[str, ...] = tuple(TINY_SHAPES)) -> str:
    """``train.py`` under ``launcher`` into ``run_dir``; returns its output (the log). The FSDP launches get no
    ``ACCELERATE_USE_CPU``: the trainer finds the CPU processes itself, as it must for the README's command."""
    env = CPU_PROCESSES if "--multi_gpu" in launcher else {"OMP_NUM_THREADS": "1"}
    result = run_script([*launcher, "train.py", *base, f"hydra.run.dir={run_dir}", *overrides], timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout + result.stderr


def losses(run_dir: Path) -> dict[int, float]:
    return {record["step"]: record["loss"] for record in read_metrics(run_dir)}


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ddp") / "run"
    launch(accelerate_launch(2), run_dir, "trainer.max_steps=8", *STEPS)
    return run_dir


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory) -> tuple[Path, str]:
    """This module's runs on 2 FSDP processes, in one launch (``runs_in_turn``), in folders of their names: ``run``
    (8 steps), ``resumed`` (its checkpoint-4 resumed), ``grpo_lora`` and ``grpo_full`` (GRPO from its weights, with
    LoRA adapters and a KL reference, and fully fine-tuned). Returns their folder and what the launch printed."""
    root = tmp_path_factory.mktemp("fsdp")
    run = (*TINY_SHAPES, "trainer.max_steps=8", *STEPS)
    runs = {
        "run": run,
        "resumed": (*run, f"trainer.resume={root / 'run' / 'checkpoints' / 'checkpoint-4'}"),
        "grpo_lora": grpo(root / "run", "lora.enabled=true", "lora.rank=4", "grpo.beta=0.04"),
        "grpo_full": grpo(root / "run", "grpo.beta=0"),
    }
    plan = {name: [*overrides, f"hydra.run.dir={root / name}"] for name, overrides in runs.items()}
    return root, launch_in_turn(fsdp_launch(), plan, root / "plan.json", {"OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def fsdp_run(fsdp_runs) -> Path:
    root, printed = fsdp_runs
    ended(printed, "run")
    return root / "run"


@pytest.mark.slow
def test_fsdp_trains_like_ddp_and_checkpoints_slices_plus_whole_weights(fsdp_run, ddp_run):
    ddp = ddp_run
    sharded, replicated = losses(fsdp_run), losses(ddp)
    assert sorted(sharded) == list(range(1, 9))
    assert max(abs(sharded[s] - replicated[s]) for s in sharded) < FSDP_TOLERANCE
    checkpoint = fsdp_run / "checkpoints" / "checkpoint-8"
    for sliced in ("pytorch_model_fsdp_0", "optimizer_0", "ema_sharded"):  # one file per process
        assert sorted(p.name for p in (checkpoint / sliced).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    for weights in ("transformer", "transformer_ema"):  # whole, gathered on the main process
        whole = load_file(checkpoint / weights / WEIGHTS)
        reference = load_file(ddp / "checkpoints" / "checkpoint-8" / weights / WEIGHTS)
        assert whole.keys() == reference.keys()
        assert max((whole[k] - reference[k]).abs().max().item() for k in whole) < 1e-4
    assert (fsdp_run / "samples" / "step_0000008.png").is_file()  # sampled on both processes, written by one


@pytest.mark.slow
def test_fsdp_resume_reproduces_the_uninterrupted_run(fsdp_run, fsdp_runs):
    root, printed = fsdp_runs
    ended(printed, "resumed")
    straight, again = losses(fsdp_run), losses(root / "resumed")
    assert sorted(again) == [5, 6, 7, 8]
    assert [again[s] for s in again] == [straight[s] for s in again]
    for weights in ("transformer", "transformer_ema"):
        one = load_file(fsdp_run / "checkpoints" / "checkpoint-8" / weights / WEIGHTS)
        other = load_file(root / "resumed" / "checkpoints" / "checkpoint-8" / weights / WEIGHTS)
        assert all(torch.equal(one[k], other[k]) for k in one)


def without_ema(checkpoint: Path) -> None:
    """``checkpoint`` as a run with ``trainer.ema_decay=0`` writes it: no EMA folders, nor manifest entries."""
    for folder in ("ema_sharded", "transformer_ema"):
        shutil.rmtree(checkpoint / folder)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"] = {name: size for name, size in manifest["files"].items() if "ema" not in name.split("/")[0]}
    manifest["config"]["trainer"]["ema_decay"] = 0.0
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def lrs(run_dir: Path) -> dict[int, float]:
    return {record["step"]: record["lr"] for record in read_metrics(run_dir)}


@pytest.mark.slow
def test_a_two_process_checkpoint_resumes_on_three_at_the_same_lr_then_exports_and_samples(fsdp_run, tmp_path):
    """The newest checkpoint damaged where sizes do not show it (its model's ``.metadata`` zeroed: torch's
    CheckpointException, a BaseException), the previous one written without EMA: the resume on 3 processes falls
    back to checkpoint-4, starts the EMA from its weights, and trains steps 5-8 at the uninterrupted run's LR."""
    run_dir = tmp_path / "run"
    shutil.copytree(fsdp_run, run_dir)
    metadata = run_dir / "checkpoints" / "checkpoint-8" / "pytorch_model_fsdp_0" / ".metadata"
    metadata.write_bytes(bytes(metadata.stat().st_size))
    without_ema(run_dir / "checkpoints" / "checkpoint-4")
    log = " ".join(launch(fsdp_launch(3), run_dir, "trainer.max_steps=8", *STEPS, "trainer.resume=latest").split())
    assert "Traceback" not in log
    assert "checkpoint-8 could not be loaded (CheckpointException on process" in log
    assert f"resuming from {run_dir}/checkpoints/checkpoint-4 instead" in log
    assert "checkpoint-4 holds no EMA weights" in log and "the EMA starts from its restored weights" in log
    assert "written by 2 processes, on 3" in log and "the LR schedule continue exactly" in log
    assert "Processes 3 processes (FSDP2) on cpu" in log
    straight, resumed = lrs(fsdp_run), lrs(run_dir)
    assert sorted(resumed) == list(range(1, 9)) and len({straight[s] for s in range(5, 9)}) == 4
    assert all(math.isclose(resumed[s], straight[s], rel_tol=1e-6, abs_tol=1e-12) for s in range(5, 9)), resumed
    manifest = json.loads((run_dir / "checkpoints" / "checkpoint-8" / "manifest.json").read_text())
    assert manifest["world_size"] == 3 and manifest["launch"] == "fsdp"
    assert manifest["lr_schedule_unit"] == "optimizer_updates"
    exported = run_here(["scripts/export.py", str(run_dir), f"out_dir={tmp_path / 'export'}"])
    assert exported.returncode == 0, exported.stderr[-3000:]
    sampled = run_here(["scripts/sample.py", str(run_dir), "prompts=[a red circle]", "images_per_prompt=1",
                        f"out_dir={tmp_path / 'samples'}", "steps=2"])  # fmt: skip
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert len(list((tmp_path / "samples").glob("*.png"))) == 1


@pytest.mark.slow
def test_a_sharded_checkpoint_resumed_without_fsdp_is_refused_naming_the_launch(fsdp_run, tmp_path):
    """One process cannot read FSDP's sharded state: refused before any model loads, the checkpoints untouched and
    not called damaged."""
    run_dir = tmp_path / "run"
    shutil.copytree(fsdp_run, run_dir)
    before = digest(run_dir / "checkpoints"), (run_dir / "metrics.jsonl").read_text()
    result = run_here(
        ["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", "trainer.max_steps=10", "trainer.resume=latest"]
    )
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2 and "Traceback" not in output, output[-3000:]
    assert "checkpoint-8" in output and "written under FSDP by 2 processes" in output and "intact" in output
    assert "--config_file accelerate_configs/fsdp.yaml" in output and "from a copy" not in output
    assert (digest(run_dir / "checkpoints"), (run_dir / "metrics.jsonl").read_text()) == before


@pytest.mark.slow
def test_a_ddp_checkpoint_resumed_under_fsdp_is_refused_on_every_process(ddp_run, tmp_path):
    """FSDP reads only sharded state: every process refuses before any model loads (exit 2, read back from the run
    folder as job scripts do; no traceback but the launcher's report of a failed child), and the checkpoints are not
    called damaged."""
    run_dir = tmp_path / "run"
    shutil.copytree(ddp_run, run_dir)
    before = digest(run_dir / "checkpoints"), (run_dir / "metrics.jsonl").read_text()
    since = time.time()
    overrides = [*TINY_SHAPES, f"hydra.run.dir={run_dir}", "trainer.max_steps=10", "trainer.resume=latest"]
    result = run_script([*fsdp_launch(), "train.py", *overrides], timeout=300, env={"OMP_NUM_THREADS": "1"})
    output = " ".join((result.stdout + result.stderr).split())
    command = [sys.executable, "-m", "dit_trainer.runs.failures", str(run_dir), "--since", str(since)]
    assert subprocess.run(command, cwd=REPO, capture_output=True, text=True).stdout.strip() == "2", output[-3000:]
    assert output.count("Traceback") == 1 and "ChildFailedError" in output, output[-6000:]
    assert "exitcode : 1 " not in output  # no process ended on an uncaught exception
    assert "written without FSDP (DDP on 2 processes" in output and "intact" in output
    assert "`python train.py ...` (one process) or a DDP launch" in output and "from a copy" not in output
    assert (digest(run_dir / "checkpoints"), (run_dir / "metrics.jsonl").read_text()) == before


def grpo(init_dir: Path, *overrides: str) -> tuple[str, ...]:
    """Three tiny GRPO epochs (one prompt x 4 images, 3 sampling steps) from ``init_dir``'s weights."""
    return ("+experiment=shapes_grpo", f"trainer.init_from={init_dir}", GRPO_PROMPTS, "grpo.prompt_file=null",
            "grpo.prompts_per_epoch=1", "grpo.group_size=4", "grpo.sample_steps=3", "grpo.sde_steps=null",
            "grpo.passes=1", "grpo.minibatches=1", "grpo.rollout_batch_size=4", "trainer.max_steps=3",
            "trainer.checkpoint_every=3", "trainer.sample_every=0", "trainer.log_every=1",
            "trainer.sample_prompts=[a red circle]", "diffusion.sample_steps=3", "monitor.reward.enabled=false",
            *overrides)  # fmt: skip


@pytest.mark.slow
def test_grpo_with_lora_trains_and_checkpoints_sharded(fsdp_runs):
    """GRPO from the FSDP run's weights, LoRA adapters sharded with the frozen base, the KL reference being the same
    sharded model with its adapters off."""
    root, printed = fsdp_runs
    ended(printed, "grpo_lora")
    records = read_metrics(root / "grpo_lora")
    assert [r["step"] for r in records] == [1, 2, 3] and all(r["loss"] == r["loss"] for r in records)
    adapter = root / "grpo_lora" / "checkpoints" / "checkpoint-3" / "transformer_lora"
    assert adapter.is_dir() and any(adapter.glob("*.safetensors"))


@pytest.mark.slow
def test_grpo_full_fine_tuning_sharded_trains_the_root_unit(fsdp_runs):
    """The rollout's forwards without backward leave the root unit (the parameters outside the blocks) gathered:
    the preflight must see the sharded parameters that get the gradient, and the update must move them."""
    root, printed = fsdp_runs
    ended(printed, "grpo_full")
    run_dir = root / "grpo_full"
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]
    start = load_file(run_dir / "init" / "transformer_ema" / WEIGHTS)
    trained = load_file(run_dir / "checkpoints" / "checkpoint-3" / "transformer" / WEIGHTS)
    root_unit = {key for key in start if not key.startswith("transformer_blocks.")}  # the blocks are units of their own
    assert trained.keys() == start.keys() and {"pos_embed.proj.weight", "scale_shift_table"} <= root_unit
    moved = {key: (trained[key] - start[key]).abs().max().item() for key in root_unit}
    assert min(moved.values()) > 1e-4, moved  # Adam moves each by ~lr (3e-4) per epoch when it has a gradient
