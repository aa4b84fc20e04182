"""Frozen autoencoders (``components/vae.py``): the shipped VAE's normalised latents, scaling and shift factors, the
pixel-space identity, and a missing VAE named with its fix."""

import pytest
import torch
from diffusers import AutoencoderDC, AutoencoderKL

from dit_trainer.components.vae import PixelVAE, build_vae, known_downsample_factor
from dit_trainer.config import ASSETS_DIR, VAEConfig
from dit_trainer.data.sources.shapes import ShapesDataset
from dit_trainer.errors import ModelLoadError

CPU = torch.device("cpu")


def _shapes_images(count: int = 8) -> torch.Tensor:
    dataset = ShapesDataset(count, seed=1)
    return torch.stack([dataset[i]["image"] for i in range(count)])


def test_shipped_vae_encodes_normalised_latents_and_reconstructs():
    vae = build_vae(VAEConfig(pretrained=str(ASSETS_DIR / "shapes_vae")), CPU)
    assert not any(p.requires_grad for p in vae.parameters())
    images = _shapes_images(64)
    latents = vae.encode(images)
    assert latents.shape == (64, 4, 16, 16) and vae.downsample_factor == 2
    # per-channel statistics from the VAE's config make every channel roughly zero-mean, unit-variance
    assert latents.mean(dim=(0, 2, 3)).abs().max() < 0.2
    assert ((latents.std(dim=(0, 2, 3)) - 1).abs() < 0.2).all()
    assert torch.nn.functional.mse_loss(vae.decode(latents), images) < 0.01


def test_vae_uses_scaling_and_shift_factor_without_per_channel_statistics(tmp_path):
    torch.manual_seed(0)
    AutoencoderKL(block_out_channels=(32,), latent_channels=4, scaling_factor=0.5, shift_factor=0.25).save_pretrained(
        tmp_path / "vae"
    )
    vae = build_vae(VAEConfig(pretrained=str(tmp_path), subfolder="vae"), CPU)
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    raw = vae.autoencoder.encode(images).latent_dist.mode()
    torch.testing.assert_close(vae.encode(images), (raw - 0.25) * 0.5)
    latents = vae.encode(images)
    torch.testing.assert_close(vae.decode(latents), vae.autoencoder.decode(raw).sample.clamp(-1, 1))


def test_pixel_vae_is_the_identity():
    vae = build_vae(VAEConfig(kind="pixel"), CPU)
    images = _shapes_images(2)
    assert isinstance(vae, PixelVAE) and vae.latent_channels == 3 and vae.downsample_factor == 1
    assert torch.equal(vae.encode(images), images) and torch.equal(vae.decode(images), images)


def test_missing_vae_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(ModelLoadError) as caught:
        build_vae(VAEConfig(pretrained=str(tmp_path / "missing_vae")), CPU)
    message = str(caught.value)
    assert "missing_vae" in message and "vae.pretrained" in message


def tiny_dc_autoencoder(folder) -> None:
    """A 3-block ``AutoencoderDC`` (4x, 4 latent channels) saved by path, as Sana's is laid out."""
    torch.manual_seed(0)
    AutoencoderDC(latent_channels=4, encoder_block_types="ResBlock", decoder_block_types="ResBlock",
                  encoder_block_out_channels=(8, 16, 32), decoder_block_out_channels=(8, 16, 32),
                  encoder_layers_per_block=(1, 1, 1), decoder_layers_per_block=(1, 1, 1),
                  encoder_qkv_multiscales=((), (), ()), decoder_qkv_multiscales=((), (), ()),
                  scaling_factor=0.5).save_pretrained(folder)  # fmt: skip


def test_a_deep_compression_autoencoder_gives_deterministic_scaled_latents(tmp_path):
    """Sana's kind: its latent is no posterior to sample (a drawn latent is the latent), scaled by its config's
    factor; its downsampling is known from config.json before it loads."""
    tiny_dc_autoencoder(tmp_path / "vae")
    cfg = VAEConfig(kind="autoencoder_dc", pretrained=str(tmp_path / "vae"))
    assert known_downsample_factor(cfg) == 4
    vae = build_vae(cfg, CPU)
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    raw = vae.autoencoder.encode(images).latent
    generator = torch.Generator().manual_seed(1)
    latents = vae.encode(images, generator)
    assert latents.shape == (2, 4, 8, 8) and vae.downsample_factor == 4
    assert vae.encode_posterior(images)[1] is None  # no std: caches store the latent alone
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(1).get_state())  # nothing was drawn
    torch.testing.assert_close(latents, raw * 0.5)
    torch.testing.assert_close(vae.decode(latents), vae.autoencoder.decode(raw).sample.clamp(-1, 1))
    vae.drop_encoder()
    assert vae.autoencoder.encoder is None and vae.decode(latents).shape == (2, 3, 32, 32)
