"""The memory estimate said before step 1 (``training/parallel/memory.py``): weights, gradients, optimizer state and EMA
counted exactly from the built models, activations from a meta copy of the DiT, and a run that cannot fit a GPU refused
with the batch that would fit (the refusal is a pure function of the GPU's size, tested without a GPU)."""

import logging

import pytest
import torch
from accelerate import Accelerator

from dit_trainer.components.meta import Activations
from dit_trainer.errors import ConfigError
from dit_trainer.training.parallel.memory import GiB, MemoryEstimate, check_fits, estimate_memory, report_memory
from tests.conftest import TINY_SHAPES, compose_config, one_paragraph


def _bytes(module) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in [*module.parameters(), *module.buffers()])


def test_the_fixed_part_is_the_models_bytes_exactly(tiny_parts):
    estimate = estimate_memory(tiny_parts, ema=True, compute_dtype=torch.float32)
    trained = sum(p.numel() * 4 for p in tiny_parts.dit.parameters() if p.requires_grad)
    assert estimate.weights == _bytes(tiny_parts.dit) + _bytes(tiny_parts.vae) + _bytes(tiny_parts.text_encoder)
    assert (estimate.gradients, estimate.optimizer, estimate.ema, estimate.copies) == (trained, 2 * trained, trained, 0)
    assert 0 < estimate.activations.checkpointed() < estimate.activations.whole


@pytest.mark.parametrize(("name", "factor"), [("adamw8bit", 0.5), ("adafactor", 0.0), ("prodigy", 4.0)])
def test_the_optimizer_state_is_the_chosen_optimizers(tiny_parts, name, factor):
    adamw = estimate_memory(tiny_parts, ema=False, compute_dtype=torch.float32)
    other = estimate_memory(tiny_parts, ema=False, compute_dtype=torch.float32, optimizer=name)
    assert other.optimizer == int(factor * adamw.optimizer / 2) and other.gradients == adamw.gradients


def test_mixed_precision_and_ddp_add_their_copies_and_autocast_keeps_more_than_half_the_activations(tiny_parts):
    """Under CUDA's bf16 autocast the norms run in float32 and the residual stream stays float32: the activations
    are not half of float32's, as a model cast to bf16 would keep (measured here: 0.64)."""
    full = estimate_memory(tiny_parts, ema=False, compute_dtype=torch.float32)
    half = estimate_memory(tiny_parts, ema=False, compute_dtype=torch.bfloat16, ddp=True)
    parameters = sum(p.numel() for p in tiny_parts.dit.parameters())
    assert full.ema == 0 and half.copies == half.gradients + 2 * parameters  # DDP's buckets + autocast's bf16 weights
    assert 0.55 < half.activations.whole / full.activations.whole < 0.8


# 10 GiB that do not depend on the batch; per image 16 blocks of 64 MiB each, given 6.4 MiB each: 1 GiB, 0.1625 GiB
# with every block checkpointed (their inputs and one block recomputed), 0.6125 GiB with every 2nd
ACTIVATIONS = Activations(0, (GiB // 16,) * 16, (GiB // 160,) * 16)
ESTIMATE = MemoryEstimate(4 * GiB, 2 * GiB, 4 * GiB, 0, 0, ACTIVATIONS)


def test_selective_checkpointing_keeps_the_other_blocks_saves():
    assert ACTIVATIONS.whole == GiB and ACTIVATIONS.checkpointed(1) == 16 * (GiB // 160) + GiB // 16
    assert ACTIVATIONS.checkpointed(2) == GiB // 2 + 8 * (GiB // 160) + GiB // 16
    assert ACTIVATIONS.checkpointed(16) == GiB - GiB // 16 + GiB // 160 + GiB // 16  # block 0 only


def test_a_run_that_fits_is_not_refused():
    check_fits(ESTIMATE, batch_size=30, checkpointing=0, device_bytes=40 * GiB)
    check_fits(ESTIMATE, batch_size=180, checkpointing=1, device_bytes=40 * GiB)
    check_fits(ESTIMATE, batch_size=48, checkpointing=2, device_bytes=40 * GiB)


def test_a_run_that_cannot_fit_names_accumulation_then_checkpointing():
    with pytest.raises(ConfigError) as refused:
        check_fits(ESTIMATE, batch_size=64, checkpointing=0, device_bytes=40 * GiB)
    message = one_paragraph(refused.value, "trainer.batch_size")
    assert "74.0 GiB" in message and "40.0 GiB" in message
    assert (
        "set `trainer.batch_size=30` with `trainer.gradient_accumulation_steps=3` to keep the images per step or "
        in message
    )
    assert message.endswith("or `trainer.gradient_checkpointing=true` (fits 184 images).")
    assert "gradient_checkpointing_every" not in message  # every 2nd block: 48 images, fewer than 64


def test_selective_checkpointing_is_named_when_it_fits_the_batch():
    with pytest.raises(ConfigError) as refused:
        check_fits(ESTIMATE, batch_size=40, checkpointing=0, device_bytes=40 * GiB)
    message = one_paragraph(refused.value, "trainer.batch_size")
    selective = "`trainer.gradient_checkpointing=true trainer.gradient_checkpointing_every=2` (fits 48 images)"
    assert message.index("`trainer.batch_size=30`") < message.index(selective) < message.index("(fits 184 images)")


def test_a_model_that_cannot_fit_at_all_points_to_lora_and_fsdp():
    with pytest.raises(ConfigError, match="alone need 10.0 GiB.*`lora.enabled=true`.*fsdp"):
        check_fits(ESTIMATE, batch_size=1, checkpointing=1, device_bytes=8 * GiB)


def test_under_compile_a_batch_over_the_estimate_is_warned_about_not_refused(caplog):
    """The estimate counts eager blocks' saves; compiled ones keep less (DiT-XL/2: two thirds), so it may fit."""
    Accelerator(cpu=True)  # accelerate's logger asks for the process's state
    with caplog.at_level(logging.WARNING):
        check_fits(ESTIMATE, batch_size=64, checkpointing=0, device_bytes=40 * GiB, compiled=True)
    [warning] = [record.message for record in caplog.records if record.levelno == logging.WARNING]
    assert "74.0 GiB" in warning and "`trainer.batch_size=30`" in warning
    assert "Not refused under `trainer.compile=true`" in warning


def test_the_estimate_is_logged_once_at_start_on_the_cpu(tiny_parts, caplog):
    cfg = compose_config([*TINY_SHAPES, "trainer.batch_size=1000000"])  # no GPU: logged, never refused
    with caplog.at_level(logging.INFO):
        report_memory(cfg.trainer, cfg.optim.name, tiny_parts, Accelerator(cpu=True))
    lines = [record.message for record in caplog.records if "Memory per process" in record.message]
    assert len(lines) == 1 and "with gradient checkpointing" in lines[0] and "trainer.batch_size=1000000" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.INFO):  # an online method's forwards take its own batches
        report_memory(cfg.trainer, cfg.optim.name, tiny_parts, Accelerator(cpu=True), refuse_unfit=False)
    [line] = [record.message for record in caplog.records if "Memory per process" in record.message]
    assert "trainer.batch_size" not in line and "the method's own batches" in line
