"""``scripts/verify_gradients.py`` and the trainer's preflight, run as users run them."""

import pytest

from ..conftest import TINY_SHAPES, run_here


def _reentrant_lora(base) -> list[str]:
    """LoRA on a frozen base with re-entrant checkpointing: the blocks' inputs do not require grad, nothing trains."""
    return [
        f"model.pretrained={base}",
        "lora.enabled=true",
        "trainer.gradient_checkpointing=true",
        "trainer.reentrant_checkpointing=true",
    ]


@pytest.mark.slow
def test_verify_gradients_passes_the_shapes_experiment_and_prints_the_table():
    result = run_here(["scripts/verify_gradients.py", "+experiment=shapes"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "trainable %" in out and "LoRA adapters" in out
    for component in ("dit", "vae", "text_encoder"):
        assert f"\n{component} " in out
    assert "trainable parameters that did not change: none" in out and "frozen parameters that changed: none" in out
    assert "Gradient norms at the first step: dit " in out


@pytest.mark.slow
def test_verify_gradients_exits_1_naming_the_finding_when_the_flow_is_broken(tiny_pixart_dir):
    result = run_here(["scripts/verify_gradients.py", *TINY_SHAPES, *_reentrant_lora(tiny_pixart_dir)])
    assert result.returncode == 1, result.stderr[-3000:]
    assert "[reentrant_checkpoint]" in result.stdout and "transformer.transformer_blocks.0" in result.stdout
    assert "use_reentrant=False" in result.stdout and "FAILED" in result.stdout


@pytest.mark.slow
def test_training_stops_before_the_first_step_with_the_doctor_s_explanation(tiny_pixart_dir, tmp_path):
    run_dir = tmp_path / "run"
    result = run_here(["train.py", *TINY_SHAPES, *_reentrant_lora(tiny_pixart_dir), f"hydra.run.dir={run_dir}"])
    assert result.returncode == 2
    assert "[reentrant_checkpoint]" in result.stderr and "trainer.reentrant_checkpointing=false" in result.stderr
    assert "Traceback" not in result.stderr and "RuntimeError" not in result.stderr  # not PyTorch's own error
    assert not (run_dir / "checkpoints").exists()
