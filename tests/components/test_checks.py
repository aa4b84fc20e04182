"""The model sections' checks (``components/checks.py``): a model by hub id missing from this machine is named with
its key and fix, and a resolution the VAE and the patches do not divide is refused with the nearest ones."""

import pytest

from dit_trainer.errors import ConfigError, ModelLoadError

from ..conftest import compose_config, one_paragraph


def test_offline_validation_names_a_model_missing_from_this_machine():
    with pytest.raises(ModelLoadError) as caught:
        compose_config(["+experiment=shapes", "vae=sd"])
    message = str(caught.value)
    assert "vae.pretrained=stabilityai/sd-vae-ft-ema" in message and "vae.pretrained=DIR" in message


@pytest.mark.parametrize("key", ["vae.pretrained", "conditioner.pretrained", "model.pretrained"])
def test_a_missing_model_folder_names_its_key(key, tmp_path):
    with pytest.raises(ModelLoadError) as caught:
        compose_config(["+experiment=shapes", f"{key}=org/no-such-model-{tmp_path.name}"])
    assert f"{key}=org/no-such-model" in str(caught.value) and f"{key}=DIR" in str(caught.value)


@pytest.mark.parametrize(
    ("overrides", "step", "nearest"),
    [(["data.resolution=36"], "2 × 4 = 8", "`data.resolution=32` or `data.resolution=40`"),
     (["data.resolution=33"], "2 × 4 = 8", "`data.resolution=32` or `data.resolution=40`"),
     (["vae=pixel", "data.resolution=34"], "1 × 4 = 4", "`data.resolution=32` or `data.resolution=36`"),
     (["model.patch_size=2", "data.resolution=14"], "2 × 2 = 4", "`data.resolution=12` or `data.resolution=16`")],
)  # fmt: skip
def test_a_resolution_the_vae_and_patches_do_not_divide_is_refused_at_validation(overrides, step, nearest):
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", *overrides])
    message = one_paragraph(caught.value, "data.resolution")
    assert step in message and nearest in message


def test_an_instruction_for_a_conditioner_that_puts_none_before_prompts_is_refused():
    with pytest.raises(ConfigError) as caught:
        compose_config(["+experiment=shapes", "conditioner.instruction=[Describe the image in detail:]"])
    assert "conditioner.instruction" in one_paragraph(caught.value, "conditioner.instruction")


@pytest.mark.parametrize(
    ("overrides", "key"),
    [(["+experiment=shapes_sd3", "diffusion.resolution_shift=true", "diffusion.shift=1"], "diffusion.resolution_shift"),
     (["+experiment=shapes_sd3", "conditioner=sd3"], "conditioner.pooling")],
)  # fmt: skip
def test_a_setting_the_family_or_conditioner_would_ignore_or_mismatch_is_refused(overrides, key):
    """Flux's resolution shift with SD3 (whose pipeline samples another grid); a pooling for SD3's own encoders
    (which pool themselves)."""
    with pytest.raises(ConfigError) as caught:
        compose_config(overrides)
    one_paragraph(caught.value, key)
