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
