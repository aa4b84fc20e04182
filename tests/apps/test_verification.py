"""The training setup check behind ``scripts/verify_gradients.py`` (``verification.py``): a component that should be
frozen and is not is reported. (The script and train.py's preflight as users run them:
tests/e2e/test_verification.py.)"""

import torch

from tests.conftest import TINY_SHAPES, components_of, compose_config


def test_verification_warns_about_a_component_that_should_be_frozen():
    from dit_trainer.apps.verification import verify_training_setup
    from dit_trainer.config import call_with_sections

    cfg = compose_config(TINY_SHAPES)
    parts = components_of(cfg)
    parts.vae.requires_grad_(True)  # the planted bug: a "frozen" component that is not
    report = call_with_sections(verify_training_setup, cfg, parts=parts, device=torch.device("cpu"))
    assert not report.ok and report.gradient_flow.ok
    assert len(report.warnings) == 1 and report.warnings[0].startswith("the vae should be frozen")
    assert report.changes.unchanged_trainable and all(n.startswith("vae.") for n in report.changes.unchanged_trainable)
    assert "FAILED" in str(report)


def test_parameters_whose_gradients_are_always_zero_are_named_apart_and_pass(tmp_path):
    """SD3's last block keeps only the image tokens, so its text queries get exactly zero gradients: every SD3 config,
    the shapes_sd3 recipe's too, was reported FAILED ("trainable parameters that did not change") and exit 1."""
    from dit_trainer.apps.verification import verify_training_setup
    from dit_trainer.config import call_with_sections
    from tests.tiny_sd3 import overrides, write_tiny_sd3

    cfg = compose_config([*TINY_SHAPES, *overrides(write_tiny_sd3(tmp_path / "sd3"))])
    report = call_with_sections(verify_training_setup, cfg, parts=components_of(cfg), device=torch.device("cpu"))
    assert report.ok and "OK: training trains the DiT" in str(report), str(report)
    assert "dit.transformer.transformer_blocks.1.attn.add_q_proj.weight" in report.changes.zero_gradient
    assert "gradients were exactly zero at every step" in str(report)
