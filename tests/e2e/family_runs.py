"""What the families' end-to-end tests (``test_sd3``, ``test_flux``, ``test_sana``) share: training in this process
(no interpreter start-up), a run and its resumed copy, the checks that the copy is the run bit for bit, that LoRA
trained only its adapters and that GRPO moved the weights, and the per-seed noise our sampler starts from."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from dit_trainer.apps.export import MANIFEST, ExportResult, export_run
from dit_trainer.assemble import run
from dit_trainer.config import ExportConfig
from dit_trainer.run_config import to_train_config

from ..conftest import CONFIG_DIR, TINY_SHAPES, read_metrics

WEIGHTS = "diffusion_pytorch_model.safetensors"
RESUME_AT, STEPS = 15, 30  # the resumed copy starts from checkpoint-15 of a 30-step run
# Every step logged, no sample grids, batches of 8, a checkpoint every 15 steps.
COMMON = (
    "trainer.log_every=1",
    "trainer.sample_every=0",
    f"trainer.checkpoint_every={RESUME_AT}",
    "trainer.batch_size=8",
)


def train_in_process(run_dir: Path, *overrides: str, base: tuple[str, ...] = tuple(TINY_SHAPES)) -> Path:
    """``train.py`` with ``base`` + ``overrides`` in this process: compose, validate (with the command line and the
    run folder, as train.py does for a GRPO run), run."""
    args = [*base, *overrides]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=args)
    result = run(to_train_config(cfg, args, run_dir), run_dir)
    assert not result.preempted
    return run_dir


def straight_and_resumed(root: Path, *overrides: str) -> Path:
    """``root/straight``: 30 steps (a checkpoint every 15), and ``root/resumed``: the same run resumed from its
    checkpoint-15."""
    common = (*overrides, *COMMON, f"trainer.max_steps={STEPS}")
    train_in_process(root / "straight", *common)
    train_in_process(root / "resumed", *common, f"trainer.resume={root / 'straight' / 'checkpoints' / 'checkpoint-15'}")
    return root


def family_fixtures(name: str, write: Callable[[Path], Path], overrides: Callable[[Path], list[str]]):
    """A family's module-scoped fixtures ``<name>_folder``, its tiny pipeline folder (``write``), and ``<name>_runs``,
    ``straight_and_resumed`` with its ``overrides`` of that folder; for a test module to bind to those names."""

    @pytest.fixture(scope="module", name=f"{name}_folder")
    def folder(tmp_path_factory) -> Path:
        return write(tmp_path_factory.mktemp(name))

    @pytest.fixture(scope="module", name=f"{name}_runs")
    def runs(request, tmp_path_factory) -> Path:
        root = tmp_path_factory.mktemp(f"{name}_runs")
        return straight_and_resumed(root, *overrides(request.getfixturevalue(f"{name}_folder")))

    return folder, runs


def losses(run_dir: Path) -> dict[int, float]:
    return {record["step"]: record["loss"] for record in read_metrics(run_dir)}


def check_resumed_run(root: Path) -> list[float]:
    """The resumed copy logs steps 16-30 with the losses of the uninterrupted run and ends with its weights; the
    uninterrupted run's 30 losses."""
    straight, resumed = losses(root / "straight"), losses(root / "resumed")
    assert sorted(straight) == list(range(1, STEPS + 1)) and sorted(resumed) == list(range(RESUME_AT + 1, STEPS + 1))
    assert [resumed[s] for s in resumed] == [straight[s] for s in resumed]  # bit for bit
    a, b = (load_file(root / name / "checkpoints" / f"checkpoint-{STEPS}" / "transformer" / WEIGHTS)
            for name in ("straight", "resumed"))  # fmt: skip
    assert all(torch.equal(a[name], b[name]) for name in a)
    return [straight[s] for s in range(1, STEPS + 1)]


def train_lora(run_dir: Path, folder: Path, *overrides: str, every_b: bool = True) -> dict[str, torch.Tensor]:
    """3 steps of LoRA (rank 4, gradient checkpointing, no warm-up) on the transformer of the pipeline folder
    ``folder``, after ``overrides``; the adapter, checked: the checkpoint holds no whole transformer, the adapter
    nothing but LoRA weights, and every B matrix (zero at the start; ``every_b=False``: some) has trained."""
    train_in_process(
        run_dir, *overrides, *COMMON, "trainer.max_steps=3", "trainer.checkpoint_every=3", f"model.pretrained={folder}",
        "model.subfolder=transformer", "lora.enabled=true", "lora.rank=4", "trainer.gradient_checkpointing=true",
        "optim.warmup_steps=0",
    )  # fmt: skip
    checkpoint = run_dir / "checkpoints" / "checkpoint-3"
    assert not (checkpoint / "transformer").exists()
    adapter = load_file(checkpoint / "transformer_lora" / "adapter_model.safetensors")
    assert all("lora_" in name for name in adapter)  # nothing else trained
    lora_b = [name for name in adapter if "lora_B" in name]
    assert lora_b and (all if every_b else any)(adapter[name].abs().sum() > 0 for name in lora_b)
    return adapter


def grpo_weights(init_dir: Path, run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """The GRPO run's weights at checkpoint-``step``, checked: finite, the same tensors as the EMA weights of the
    init run's last checkpoint it started from, and not all equal to them."""
    start = load_file(init_dir / "checkpoints" / f"checkpoint-{STEPS}" / "transformer_ema" / WEIGHTS)
    final = load_file(run_dir / "checkpoints" / f"checkpoint-{step}" / "transformer" / WEIGHTS)
    assert sorted(final) == sorted(start) and all(torch.isfinite(t).all() for t in final.values())
    assert any(not torch.equal(final[name], start[name]) for name in start), "GRPO left the weights unchanged"
    return final


def export(run_dir: Path, out_dir: Path, pipeline: str | None) -> ExportResult:
    """``run_dir`` exported to ``out_dir``, checked: a whole ``pipeline`` folder whose usage loads it with
    ``from_pretrained``, or (``pipeline`` None) the pipeline without its text encoders and the run's text encoder in
    ``conditioner/``."""
    result = export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(out_dir)))
    assert json.loads((out_dir / MANIFEST).read_text()) == result.manifest
    if pipeline is None:
        assert not result.pipeline
        names = {p.name for p in out_dir.iterdir()}
        assert {"conditioner", MANIFEST, "model_index.json", "scheduler", "transformer", "vae"} <= names
        assert "text_encoder" not in names  # the pipeline's own encoders: not this run's
        return result
    assert result.pipeline and json.loads((out_dir / "model_index.json").read_text())["_class_name"] == pipeline
    assert f"{pipeline}.from_pretrained" in result.usage
    return result


def seeded_noise(shape: tuple[int, ...], seeds: list[int]) -> torch.Tensor:
    """The starting latents our sampler draws for ``seeds`` (one generator per image), to hand a pipeline."""
    return torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(s)) for s in seeds])
