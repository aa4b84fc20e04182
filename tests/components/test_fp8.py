"""``precision.fp8`` (``components/fp8.py``): where no FP8 GPU is, one paragraph and exit 2 before any model loads;
with torchao's emulation the same conversion trains on the CPU, only the blocks' linear layers are converted (the
state-dict keys unchanged), and a run resumes bit-exact."""

import logging

import pytest
import torch
from torch import nn

from dit_trainer.components.fp8 import apply_fp8
from dit_trainer.config.precision import PrecisionConfig
from dit_trainer.errors import ConfigError
from dit_trainer.run_config import validate

from ..conftest import (
    SHAPES_TRANSFORMER,
    TINY_SHAPES,
    compose_config,
    one_paragraph,
    read_metrics,
    run_here,
    train_here,
)

pytest.importorskip("torchao", reason="FP8 training runs through torchao (the test extra installs it)")
no_fp8_gpu = pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9), reason="this GPU runs FP8"
)
EMULATED = ("precision.fp8=true", "precision.fp8_emulate=true")


@no_fp8_gpu
def test_fp8_without_an_fp8_gpu_exits_2_with_one_paragraph_before_any_model_loads(tmp_path):
    result = run_here(["train.py", *TINY_SHAPES, "precision.fp8=true", f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: Invalid config: `precision.fp8` is True") and "compute capability 8.9" in error
    assert "precision.fp8_emulate=true" in error and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["precision.fp8_emulate=true"], "precision.fp8_emulate", "`precision.fp8` is false"),
        ([*EMULATED, "lora.enabled=true", "model.pretrained=x"], "precision.fp8", "frozen"),
        ([*EMULATED, "privacy.enabled=true"], "precision.fp8", "Opacus"),
    ],
)
def test_fp8_settings_that_cannot_train_are_refused(overrides, key, says):
    with pytest.raises(ConfigError) as caught:
        validate(compose_config([*TINY_SHAPES, *overrides]))
    assert says in one_paragraph(caught.value, key)


def test_only_the_blocks_linear_layers_are_converted_and_the_weights_keep_their_names(tiny_transformer):
    dit = tiny_transformer(**SHAPES_TRANSFORMER)
    keys = list(dit.state_dict())
    count = apply_fp8(PrecisionConfig(fp8=True, fp8_emulate=True), dit, torch.device("cpu"))
    converted = {name for name, module in dit.transformer.named_modules() if type(module).__name__ == "Float8Linear"}
    in_blocks = {name for name, module in dit.transformer.named_modules()
                 if name.startswith("transformer_blocks.") and isinstance(module, nn.Linear)}  # fmt: skip
    assert count == len(converted) > 0 and converted <= in_blocks
    outside = ("proj_out", "adaln_single", "caption_projection", "pos_embed")
    assert not any(name.startswith(outside) for name in converted)
    assert list(dit.state_dict()) == keys and all(p.dtype == torch.float32 for p in dit.parameters())


def test_a_model_without_a_layer_fp8_can_take_is_refused_and_a_partial_conversion_is_logged(tiny_transformer, caplog):
    """A DiT 24 wide has no block linear layer whose sizes are multiples of 16: `precision.fp8=true` converted
    nothing and the run trained exactly as without it, under a config that says FP8."""
    narrow = tiny_transformer(num_attention_heads=2, attention_head_dim=12, condition_dim=24)
    with pytest.raises(ConfigError) as caught:
        apply_fp8(PrecisionConfig(fp8=True, fp8_emulate=True), narrow, torch.device("cpu"))
    assert "multiples of 16, and theirs are 24x24" in one_paragraph(caught.value, "precision.fp8")
    with caplog.at_level(logging.INFO):
        count = apply_fp8(PrecisionConfig(fp8=True, fp8_emulate=True), tiny_transformer(), torch.device("cpu"))
    assert f"FP8 training: {count} of the DiT's" in caplog.text


@pytest.mark.slow
def test_emulated_fp8_trains_ten_steps_and_resumes_bit_exact(tmp_path):
    common = (*EMULATED, "trainer.max_steps=10", "trainer.checkpoint_every=5", "trainer.log_every=1",
              "trainer.sample_every=0", "optim.warmup_steps=0")  # fmt: skip
    train_here(tmp_path / "straight", *common)
    checkpoint = tmp_path / "straight" / "checkpoints" / "checkpoint-5"
    train_here(tmp_path / "resumed", *common, f"trainer.resume={checkpoint}")
    train_here(tmp_path / "bf16_matmuls", *common[2:], "trainer.max_steps=1")
    straight = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "straight")}
    resumed = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "resumed")}
    assert sorted(straight) == list(range(1, 11)) and sorted(resumed) == list(range(6, 11))
    assert [resumed[s] for s in range(6, 11)] == [straight[s] for s in range(6, 11)]  # bit for bit
    assert straight[10] < straight[1]
    assert read_metrics(tmp_path / "bf16_matmuls")[0]["loss"] != straight[1]  # FP8's casts changed the forward
