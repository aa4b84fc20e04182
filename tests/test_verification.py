"""``scripts/verify_gradients.py`` and the trainer's preflight, run as users run them."""

import pytest
import torch

from dit_trainer.cli import run_train_script
from dit_trainer.diagnostics.parameters import count_parameters, format_parameter_table, snapshot, step_changes

from .conftest import CONFIG_DIR, TINY_SHAPES, run_script


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
    result = run_script(["scripts/verify_gradients.py", "+experiment=shapes"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "trainable %" in out and "LoRA adapters" in out
    for component in ("dit", "vae", "text_encoder"):
        assert f"\n{component} " in out
    assert "trainable parameters that did not change: none" in out and "frozen parameters that changed: none" in out
    assert "Gradient norms at the first step: dit " in out


@pytest.mark.slow
def test_verify_gradients_exits_1_naming_the_finding_when_the_flow_is_broken(tiny_pixart_dir):
    result = run_script(["scripts/verify_gradients.py", *TINY_SHAPES, *_reentrant_lora(tiny_pixart_dir)], timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "[reentrant_checkpoint]" in result.stdout and "transformer.transformer_blocks.0" in result.stdout
    assert "use_reentrant=False" in result.stdout and "FAILED" in result.stdout


def test_verify_gradients_reports_a_bad_value_without_a_traceback(capsys):
    """What scripts/verify_gradients.py runs, in-process: a bad value is one paragraph and exit code 2."""
    code = run_train_script(CONFIG_DIR, ["+experiment=shapes", "optim.lr=-1"], lambda cfg: ("unreachable", 0))
    err = capsys.readouterr().err
    assert code == 2 and "`optim.lr`" in err and "Traceback" not in err


@pytest.mark.slow
def test_training_stops_before_the_first_step_with_the_doctor_s_explanation(tiny_pixart_dir, tmp_path):
    run_dir = tmp_path / "run"
    result = run_script(
        ["train.py", *TINY_SHAPES, *_reentrant_lora(tiny_pixart_dir), f"hydra.run.dir={run_dir}"], timeout=300
    )
    assert result.returncode == 2
    assert "[reentrant_checkpoint]" in result.stderr and "trainer.reentrant_checkpointing=false" in result.stderr
    assert "Traceback" not in result.stderr and "RuntimeError" not in result.stderr  # not PyTorch's own error
    assert not (run_dir / "checkpoints").exists()


def test_parameter_table_and_step_changes():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    count = count_parameters("dit", model)
    assert (count.trainable, count.frozen, count.total) == (10, 16, 26)
    assert "38.46" in format_parameter_table([count])
    before = snapshot(model)
    with torch.no_grad():
        model[0].weight.add_(1.0)  # a frozen parameter moved; the trainable ones did not
    changes = step_changes(model, before, prefix="dit.")
    assert changes.changed_frozen == ["dit.0.weight"]
    assert changes.unchanged_trainable == ["dit.1.weight", "dit.1.bias"] and not changes.ok


def test_verification_warns_about_a_component_that_should_be_frozen(monkeypatch):
    from dit_trainer import verification

    from .conftest import compose_config

    def build_with_a_trainable_vae(*args, **kwargs):
        parts = build_components(*args, **kwargs)
        parts.vae.requires_grad_(True)  # the planted bug: a "frozen" component that is not
        return parts

    build_components = verification.build_components
    monkeypatch.setattr(verification, "build_components", build_with_a_trainable_vae)
    report = verification.verify_training_setup(compose_config(TINY_SHAPES), torch.device("cpu"))
    assert not report.ok and report.gradient_flow.ok
    assert len(report.warnings) == 1 and report.warnings[0].startswith("the vae should be frozen")
    assert report.changes.unchanged_trainable and all(n.startswith("vae.") for n in report.changes.unchanged_trainable)
    assert "FAILED" in str(report)
