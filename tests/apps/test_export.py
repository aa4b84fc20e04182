"""Exporting a checkpoint (``export.py``): the latent normalisation folded into the VAE an export ships, or why it
cannot be; where an export may be written. (The exports of trained runs: tests/e2e/test_export.py.)"""

import pytest
import torch
from diffusers import AutoencoderKL

from dit_trainer.apps.export import _check_out_dir, fold_latent_normalisation
from dit_trainer.components.vae import FrozenVAE
from dit_trainer.errors import ConfigError

_TOL = {"atol": 1e-4, "rtol": 1e-4}


def _tiny_autoencoder(**config) -> AutoencoderKL:
    torch.manual_seed(0)
    return AutoencoderKL(
        block_out_channels=(32,), down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
        latent_channels=4, **config,
    )  # fmt: skip


def test_fold_handles_a_shift_factor_and_explains_when_it_cannot_fold():
    ours = FrozenVAE(_tiny_autoencoder(scaling_factor=0.5, shift_factor=0.3))
    folded = fold_latent_normalisation(ours)
    assert folded.config.shift_factor is None and folded.config.scaling_factor == 0.5
    z = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(folded.decode(z / 0.5).sample.clamp(-1, 1), ours.decode(z), **_TOL)

    with pytest.raises(ConfigError, match="use_post_quant_conv"):
        fold_latent_normalisation(FrozenVAE(_tiny_autoencoder(shift_factor=0.3, use_post_quant_conv=False)))
    plain = FrozenVAE(_tiny_autoencoder(use_post_quant_conv=False))  # nothing to fold: exported as is
    assert not fold_latent_normalisation(plain).config.use_post_quant_conv


def test_an_out_dir_that_is_a_file_or_holds_files_is_refused_saying_which(tmp_path):
    """A file was refused as a folder that is not empty, with the advice to remove it."""
    (tmp_path / "prompts.txt").write_text("the user's")
    with pytest.raises(ConfigError, match="it is a file, and an export is a folder"):
        _check_out_dir(tmp_path / "prompts.txt")
    with pytest.raises(ConfigError, match="a folder that already holds files"):
        _check_out_dir(tmp_path)
    (tmp_path / "empty").mkdir()
    _check_out_dir(tmp_path / "empty")
    _check_out_dir(tmp_path / "new")
