"""GRPO reward fine-tuning (``+experiment=shapes_grpo trainer.init_from=RUN``) run end to end as a user runs it: from a
finished tiny shapes run, on the CPU, with the scripts that read run folders (sample, evaluate, export) afterwards."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dit_trainer.assemble import build_trainer
from dit_trainer.runs.run_folder import MANIFEST
from dit_trainer.training.preflight import PREFLIGHT_ROWS

from ..conftest import (
    CPU_PROCESSES,
    accelerate_launch,
    compose_config,
    grpo_overrides,
    read_metrics,
    rows_trained_in_a_step,
    run_here,
    run_script,
    train_here,
)

WEIGHTS = "diffusion_pytorch_model.safetensors"
POLICY_KEYS = {
    "rollout/reward_mean",
    "rollout/reward_std",
    "rollout/zero_std_frac",
    "rollout/seconds",
    "policy/updates",
    "policy/seconds",
}
UPDATE_KEYS = {
    "policy/clip_frac",
    "policy/approx_kl",
    "policy/ratio_mean",
    "policy/loss",
    "policy/trained_trajectories",
}


def train_grpo(init_dir: Path, run_dir: Path, *extra: str, epochs: int = 4):
    result = run_here(["train.py", f"hydra.run.dir={run_dir}", *grpo_overrides(init_dir, *extra, epochs=epochs)])
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / WEIGHTS)


@pytest.fixture(scope="module")
def init_run(tmp_path_factory) -> Path:
    """A finished tiny shapes run (2 layers, 10 steps, EMA weights in its checkpoint)."""
    run_dir = tmp_path_factory.mktemp("grpo_init") / "run"
    train_here(run_dir, "trainer.max_steps=10", "trainer.checkpoint_every=10", "trainer.sample_every=0")
    return run_dir


@pytest.fixture(scope="module")
def init_weights(init_run) -> Path:
    return init_run / "checkpoints" / "checkpoint-10" / "transformer_ema"


RANDOM_STEPS = "grpo.steps_per_trajectory=2"  # of the 3 noisy steps: the draws must resume too


@pytest.fixture(scope="module")
def grpo_run(init_run, tmp_path_factory) -> Path:
    """4 GRPO epochs from ``init_run``, a checkpoint every 2, each trajectory training 2 random steps of its 3."""
    run_dir = tmp_path_factory.mktemp("grpo") / "run"
    train_grpo(init_run, run_dir, RANDOM_STEPS)
    return run_dir


# --- a GRPO run, and the scripts that read it ------------------------------------------------------------------


@pytest.mark.slow
def test_grpo_run_logs_each_epoch_and_fine_tunes_the_init_weights(grpo_run, init_run, init_weights):
    records = read_metrics(grpo_run)
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # trainer.log_every=1: one line per epoch
    assert any(r["policy/updates"] > 0 for r in records)
    for record in records:
        assert set(record) >= POLICY_KEYS, sorted(POLICY_KEYS - set(record))
        assert 0 <= record["rollout/shapes_alignment"] <= 1 and -1 <= record["rollout/shapes_margin"] <= 1
        assert 0 <= record["rollout/zero_std_frac"] <= 1
        assert record["policy/updates"] in (0, 1)
        if record["policy/updates"] == 1:  # one pass, one minibatch: the update is on the rollout's own policy
            assert set(record) >= UPDATE_KEYS, sorted(UPDATE_KEYS - set(record))
            assert record["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
            assert record["policy/clip_frac"] == 0
            assert math.isfinite(record["policy/loss"]) and record["loss"] == pytest.approx(record["policy/loss"])

    from omegaconf import OmegaConf

    saved = OmegaConf.load(grpo_run / "config.yaml")
    assert saved.trainer.init_from == str(init_run) and saved.trainer.method == "grpo"
    assert Path(saved.model.pretrained) == (grpo_run / "init" / "transformer_ema").resolve()  # its own copy
    assert Path(saved.trainer.init_weights) == init_weights.resolve()  # where it came from
    assert saved.model.num_layers == 2 and saved.diffusion.sample_steps == 4

    start = weights(init_weights)
    for step in (2, 4):
        checkpoint = grpo_run / "checkpoints" / f"checkpoint-{step}"
        assert (checkpoint / "transformer" / "config.json").is_file() and (checkpoint / MANIFEST).is_file()
        assert not (checkpoint / "transformer_lora").exists()
    final = weights(grpo_run / "checkpoints" / "checkpoint-4" / "transformer")
    assert sorted(final) == sorted(start)
    assert all(torch.isfinite(t).all() for t in final.values())
    assert any(not torch.equal(final[name], start[name]) for name in start), "GRPO left the weights unchanged"


@pytest.mark.slow
def test_sample_and_evaluate_read_a_grpo_run(grpo_run, tmp_path):
    from PIL import Image

    out_dir = tmp_path / "samples"
    result = run_here(
        [
            "scripts/sample.py",
            f"run_dir={grpo_run}",
            "prompts=[a red circle,a blue square]",
            "images_per_prompt=2",
            f"out_dir={out_dir}",
            "steps=4",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    index = [json.loads(line) for line in (out_dir / "index.jsonl").read_text().splitlines()]
    assert [entry["prompt"] for entry in index] == ["a red circle"] * 2 + ["a blue square"] * 2
    assert all(Image.open(out_dir / entry["file"]).size == (32, 32) for entry in index)

    result = run_here(
        ["scripts/evaluate.py", str(grpo_run), "images_per_prompt=2", "steps=4", f"out_dir={tmp_path / 'eval'}"]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["checkpoint"] == str(grpo_run / "checkpoints" / "checkpoint-4")
    assert report["rewards"] == {"shapes_alignment": 1.0, "shapes_margin": 1.0}  # the run's reward
    assert report["images_per_prompt"] == 2 and 0 <= report["reward/shapes_alignment"] <= 1
    assert {"color", "shape"} <= set(report)


@pytest.mark.slow
def test_a_resumed_grpo_run_matches_the_uninterrupted_one(grpo_run, init_run, tmp_path):
    run_dir = tmp_path / "resumed"
    train_grpo(init_run, run_dir, RANDOM_STEPS, epochs=2)
    result = train_grpo(init_run, run_dir, RANDOM_STEPS, "trainer.resume=latest", epochs=4)
    assert "Trained 4 steps" in result.stdout
    straight, resumed = read_metrics(grpo_run), read_metrics(run_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for key in ("loss", "rollout/reward_mean", "rollout/zero_std_frac", "grad_norm"):
        assert [r[key] for r in resumed] == [r[key] for r in straight], key
    final = "checkpoints/checkpoint-4/transformer/" + WEIGHTS
    assert (run_dir / final).read_bytes() == (grpo_run / final).read_bytes()


# --- what a GRPO run owns --------------------------------------------------------------------------------------


def own_init_run(init_run: Path, folder: Path) -> Path:
    """A copy of ``init_run`` that a test may extend, prune or delete."""
    shutil.copytree(init_run, folder)
    return folder


@pytest.mark.slow
def test_a_lora_grpo_run_owns_its_base_when_the_init_run_prunes_it(init_run, tmp_path):
    """The base a LoRA GRPO run's adapters apply to is hard-linked into its own folder: once the init run's
    checkpoint is gone (pruned by `checkpoints_total_limit`), the GRPO run still samples and exports."""
    init_dir = own_init_run(init_run, tmp_path / "init")
    run_dir = tmp_path / "lora"
    train_grpo(init_dir, run_dir, "lora.enabled=true", "lora.rank=4", "grpo.beta=0.1", epochs=2)
    own = run_dir / "init" / "transformer_ema" / WEIGHTS
    assert own.stat().st_nlink == 2  # a hard link of the init checkpoint's file: no copy made
    shutil.rmtree(init_dir / "checkpoints")
    sampled = run_here(["scripts/sample.py", str(run_dir), "prompts=[a red circle]", "images_per_prompt=1",
                          f"out_dir={tmp_path / 'samples'}", "steps=2"])  # fmt: skip
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    exported = run_here(["scripts/export.py", str(run_dir), f"out_dir={tmp_path / 'export'}"])
    assert exported.returncode == 0, exported.stderr[-3000:]


@pytest.mark.slow
def test_a_requeued_grpo_run_keeps_its_start_after_the_init_run_moves_on(init_run, tmp_path):
    """The init run writes a newer checkpoint while the GRPO run is requeued with the same command: the resume keeps
    the start it recorded (the KL anchor does not move), and once the init run is deleted the full-weight GRPO run
    still samples offline."""
    init_dir = own_init_run(init_run, tmp_path / "init")
    run_dir = tmp_path / "grpo"
    train_grpo(init_dir, run_dir, "grpo.beta=0.04", epochs=2)
    started = (run_dir / "config.yaml").read_text()
    shutil.copytree(init_dir / "checkpoints" / "checkpoint-10", init_dir / "checkpoints" / "checkpoint-20")
    result = train_grpo(init_dir, run_dir, "grpo.beta=0.04", "trainer.resume=latest", epochs=4)
    assert "Resumed from" in result.stderr + result.stdout and "Trained 4 steps" in result.stdout
    assert (run_dir / "config.yaml").read_text() == started.replace("max_steps: 2", "max_steps: 4").replace(
        "resume: null", "resume: latest"
    )
    shutil.rmtree(init_dir)
    sampled = run_here(["scripts/sample.py", str(run_dir), "prompts=[a red circle]", "images_per_prompt=1",
                          f"out_dir={tmp_path / 'samples'}", "steps=2"])  # fmt: skip
    assert sampled.returncode == 0, sampled.stderr[-3000:]


# --- what a GRPO run refuses ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_train_py_exits_2_on_an_override_that_contradicts_the_init_run(init_run, tmp_path):
    run_dir = f"hydra.run.dir={tmp_path / 'run'}"
    result = run_here(["train.py", run_dir, *grpo_overrides(init_run, "model.num_layers=3")])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "trainer.init_from" in result.stderr and "model.num_layers=3" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_a_resume_with_another_prompt_list_is_refused_unless_allowed(grpo_run, init_run, tmp_path):
    """GRPO's prompts define what it trains: refused at resume (exit 2, the key named, the checkpoint untouched); with
    `trainer.allow_config_change=true` the run goes on (the prompt sampler's state, sized for the old list, crashed)."""
    checkpoint = grpo_run / "checkpoints" / "checkpoint-2"
    before = {path: path.read_bytes() for path in checkpoint.rglob("*") if path.is_file()}
    changed = ["grpo.prompts=[a red circle,a yellow square]", f"trainer.resume={checkpoint}"]
    command = ["train.py", f"hydra.run.dir={tmp_path / 'run'}", *grpo_overrides(init_run, RANDOM_STEPS, *changed)]
    refused = run_here(command)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "-> ['a red circle', 'a yellow square'])" in refused.stderr and "grpo.prompts (" in refused.stderr
    allowed = run_here([*command, "trainer.allow_config_change=true"])
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "the reward spread of the 1 kept is restored" in allowed.stdout + allowed.stderr
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [3, 4]
    assert {path: path.read_bytes() for path in checkpoint.rglob("*") if path.is_file()} == before


# --- LoRA, the KL penalty, two processes -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_lora_grpo_run_with_a_kl_penalty_saves_adapters_and_exports_them_merged(init_run, init_weights, tmp_path):
    """LoRA with beta > 0: the KL reference is the base with the adapters switched off, 0 at the first update (the
    policy still is the reference) and positive once the adapters moved; checkpoints hold only the adapters, and
    the export merges them."""
    run_dir = tmp_path / "lora"
    train_grpo(init_run, run_dir, "lora.enabled=true", "lora.rank=4", "grpo.beta=0.1", epochs=3)
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    updated = [r for r in records if r["policy/updates"]]
    assert len(updated) >= 2, "fewer than two epochs had a group with a reward spread"
    assert updated[0]["policy/kl"] == 0
    for record in updated[1:]:
        assert record["policy/kl"] > 0 and math.isfinite(record["policy/kl"])
        assert record["policy/loss"] == pytest.approx(record["loss"])
    checkpoint = run_dir / "checkpoints" / "checkpoint-3"
    assert not (checkpoint / "transformer").exists()
    assert json.loads((checkpoint / "transformer_lora" / "adapter_config.json").read_text())["r"] == 4
    adapter = load_file(checkpoint / "transformer_lora" / "adapter_model.safetensors")
    assert any("lora_B" in name for name in adapter)

    out_dir = tmp_path / "export"
    result = run_here(["scripts/export.py", str(run_dir), f"out_dir={out_dir}"])
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((out_dir / "dit_trainer_export.json").read_text())
    assert manifest["checkpoint"] == "checkpoint-3" and manifest["weights"] == "ema"  # shapes_grpo's EMA
    merged, start = weights(out_dir / "transformer"), weights(init_weights)
    assert sorted(merged) == sorted(start)  # a plain transformer, the adapter merged in
    changed = {name for name in start if not torch.equal(merged[name], start[name])}
    targets = ("to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2")
    assert changed and all(name.removesuffix(".weight").endswith(targets) for name in changed), sorted(changed)


@pytest.mark.slow
def test_a_two_process_grpo_run(init_run, tmp_path):
    run_dir = tmp_path / "ddp"
    result = run_script(
        [*accelerate_launch(), "train.py", f"hydra.run.dir={run_dir}", *grpo_overrides(init_run, epochs=2)],
        env=CPU_PROCESSES,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("Trained 2 steps") == 1  # one summary, from the main process
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert set(record) >= POLICY_KEYS
        assert (4 * record["rollout/zero_std_frac"]).is_integer()  # 2 groups on each of 2 processes
    checkpoint = run_dir / "checkpoints" / "checkpoint-2"
    states = [(checkpoint / f"trainer_state_{rank}.safetensors").read_bytes() for rank in (0, 1)]
    assert states[0] != states[1]  # each process draws its own prompts and noise
    final = weights(checkpoint / "transformer")
    assert all(torch.isfinite(t).all() for t in final.values())


def test_the_gradient_check_runs_on_a_few_rows_of_the_first_update(init_run, tmp_path):
    """As in the supervised step (``tests/training/test_trainer.py``): the eager check must not set the run's peak."""
    rows = rows_trained_in_a_step(build_trainer(compose_config(grpo_overrides(init_run)), tmp_path))
    # each forward holds a row's conditional and unconditional halves (guidance); the update: 8 trajectories x 3 steps
    assert rows == [2 * PREFLIGHT_ROWS, 2 * 8 * 3]
