"""The training setup check behind ``scripts/verify_gradients.py`` (``verification.py``): a component that should be
frozen and is not is reported. (The script and train.py's preflight as users run them:
tests/e2e/test_verification.py.)"""

import torch

from tests.conftest import TINY_SHAPES, compose_config


def test_verification_warns_about_a_component_that_should_be_frozen(monkeypatch):
    from dit_trainer.apps import verification

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
