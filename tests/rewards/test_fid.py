"""FID and KID (``fid.py``): the numbers behave (zero for a set against itself, larger for a worse one), reference
features are cached under their fingerprint and never trusted when they do not match, and a run without validation
images is refused. (evaluate.py's FID of a trained run: tests/e2e/test_fid.py.)"""

import os

import pytest
import torch

from dit_trainer.errors import ConfigError
from dit_trainer.rewards.fid import (
    LatentFeatures,
    ReferenceSet,
    cached_reference_set,
    check_reference_size,
    distances,
    reference_cache_dir,
    require_feature_extractor,
    small_sample_warning,
    validation_reference,
)
from tests.conftest import TINY_SHAPES, compose_config, one_paragraph


def _features(count: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 16, generator=generator, dtype=torch.float64) + shift


def test_a_set_against_itself_is_zero_and_a_shifted_one_is_far():
    real = _features(300, 0)
    same = distances(real, real)
    near, far = distances(real, _features(300, 1)), distances(real, _features(300, 1, shift=0.5))
    assert abs(same["fid"]) < 1e-6
    # KID's unbiased estimator pairs no image with itself within a set but does across them: slightly negative
    assert abs(same["kid_mean"]) < 0.1 * far["kid_mean"]
    assert 0 < near["fid"] < far["fid"] and near["kid_mean"] < far["kid_mean"]
    assert far["fid"] == pytest.approx(16 * 0.25, rel=0.3)  # |mean difference|^2 dominates
    assert distances(real, _features(300, 1), seed=3) == distances(real, _features(300, 1), seed=3)


def test_reference_features_are_cached_under_their_fingerprint_and_recomputed_when_unreadable(tmp_path):
    calls = []

    def compute(seed: int = 0):
        calls.append(seed)
        return ReferenceSet(_features(8, seed), [f"caption {i}" for i in range(8)])

    first = cached_reference_set(tmp_path, {"data": "a"}, compute)
    again = cached_reference_set(tmp_path, {"data": "a"}, lambda: pytest.fail("recomputed a cached reference"))
    assert torch.equal(first.features, again.features) and again.captions == first.captions
    cached_reference_set(tmp_path, {"data": "b"}, lambda: compute(1))
    assert calls == [0, 1] and len(list(tmp_path.glob("*.safetensors"))) == 2

    for path in tmp_path.glob("*.safetensors"):
        path.write_bytes(b"not a safetensors file")
    repaired = cached_reference_set(tmp_path, {"data": "a"}, compute)
    assert calls == [0, 1, 0] and torch.equal(repaired.features, first.features)
    assert not list(tmp_path.glob(".*partial"))


def test_a_run_without_validation_images_is_refused_for_fid(tmp_path):
    run_cfg = compose_config([*TINY_SHAPES, "validation.every_n_steps=0"])
    features = LatentFeatures(None, {})
    with pytest.raises(ConfigError, match=r"`metrics`.*holds none out.*validation\.split"):
        validation_reference(run_cfg.data, run_cfg.validation, features, tmp_path, torch.device("cpu"), 8)


def test_reference_features_are_kept_where_the_user_or_the_run_says_never_in_the_home_folder(tmp_path, monkeypatch):
    """Without ``fid_cache_dir``/``monitor.fid.cache_dir`` and without a latent cache, the run's own folder (shared
    by its FID monitor and ``evaluate.py``), not ``~/.cache/dit_trainer`` that every run would write and read."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    run = tmp_path / "run"
    plain = compose_config(TINY_SHAPES)
    assert reference_cache_dir(None, plain.data, run) == run / "fid_reference"
    cached = compose_config([*TINY_SHAPES, f"data.cache_dir={tmp_path / 'latents'}"])
    assert reference_cache_dir(None, cached.data, run) == tmp_path / "latents" / "fid_reference"
    assert reference_cache_dir("~/features", cached.data, run) == tmp_path / "home" / "features"  # the user's choice


@pytest.mark.skipif(
    not os.environ.get("DIT_FID_INCEPTION_WEIGHTS"),
    reason="the standard Inception weights are not on this machine (set DIT_FID_INCEPTION_WEIGHTS=FILE)",
)
def test_the_standard_inception_features_load_from_a_local_file():
    from dit_trainer.rewards.fid import InceptionFeatures

    extractor = InceptionFeatures(os.environ["DIT_FID_INCEPTION_WEIGHTS"])
    assert extractor(torch.rand(2, 3, 32, 32)).shape == (2, 2048)


def test_a_reference_of_one_image_is_refused_and_a_small_one_is_flagged_with_its_counts():
    single = ReferenceSet(_features(1, 0), ["a red circle"])
    with pytest.raises(ConfigError) as caught:
        check_reference_size(single, "validation.split", 0.001, "hold out more images")
    assert "1 readable validation image(s) give no covariance" in one_paragraph(caught.value, "validation.split")
    small = ReferenceSet(_features(8, 0), ["x"] * 8)
    check_reference_size(small, "validation.split", 0.1, "unused")
    assert "FID from 5 samples against 8 validation images of 16-dimensional features" in small_sample_warning(5, small)
    assert small_sample_warning(20, ReferenceSet(_features(20, 0), ["x"] * 20)) is None


def test_inception_features_without_torch_fidelity_or_their_weights_file_are_refused(monkeypatch, tmp_path):
    import torchmetrics.utilities.imports as imports

    monkeypatch.setattr(imports, "_TORCH_FIDELITY_AVAILABLE", False)
    with pytest.raises(ConfigError) as caught:
        require_feature_extractor("inception", None, "monitor.fid.features", "monitor.fid.weights")
    assert "`monitor.fid.features=vae`" in one_paragraph(caught.value, "monitor.fid.features")
    require_feature_extractor("vae", None, "fid_features", "fid_weights")
    monkeypatch.setattr(imports, "_TORCH_FIDELITY_AVAILABLE", True)
    with pytest.raises(ConfigError) as caught:
        require_feature_extractor("inception", str(tmp_path / "nope.pth"), "fid_features", "fid_weights")
    assert "no file there" in one_paragraph(caught.value, "fid_weights")
