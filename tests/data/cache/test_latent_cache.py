"""The in-memory latent cache (``data/cache/latent_cache.py``): latents that are not finite are refused, naming the
captions, and so is a data set of too many unreadable images."""

import functools

import pytest
import torch

from dit_trainer.data.sources.shapes import ShapesDataset
from dit_trainer.errors import ConfigError

from ..files import photos_folder


class NonFiniteVAE:
    """Encodes like the pixel VAE, but the second image of each batch overflows."""

    def encode_posterior(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = images.float().clone()
        mean[1] = float("inf")
        return mean, torch.zeros_like(mean)


def test_the_in_memory_latent_cache_refuses_non_finite_latents():
    from dit_trainer.data.cache.latent_cache import encode_dataset

    with pytest.raises(ConfigError) as caught:
        encode_dataset(ShapesDataset(4, 8), NonFiniteVAE(), torch.device("cpu"), batch_size=2, show_progress=False)
    message = str(caught.value)
    assert "`data.cache_latents`" in message and "latent_mean is NaN/inf for 1 items" in message
    assert "'a green circle'" in message and "\n" not in message


def test_a_deterministic_encoder_caches_latents_without_a_std():
    """The pixel "VAE" (and Sana's deep-compression autoencoder) has no posterior to sample: items carry the latent
    alone, and the loss reads them as they are."""
    from dit_trainer.components.vae import PixelVAE
    from dit_trainer.data.cache.latent_cache import encode_dataset

    cached = encode_dataset(ShapesDataset(4, 8), PixelVAE(), torch.device("cpu"), batch_size=2, show_progress=False)
    item = cached[1]
    assert "latent_std" not in item and torch.equal(item["latent_mean"], ShapesDataset(4, 8)[1]["image"])


def test_too_many_unreadable_images_stop_the_encoding_naming_the_setting(tmp_path):
    """Trained from memory, the loop never reads a file again: the encoding is where `data.max_bad_fraction` holds,
    each file counted once against the whole data set."""
    from dit_trainer.components.vae import PixelVAE
    from dit_trainer.config import DataConfig
    from dit_trainer.data.bad_files import PassBadFiles
    from dit_trainer.data.cache.latent_cache import encode_dataset
    from dit_trainer.data.sources.imagefolder import ImageFolderDataset

    images = photos_folder(tmp_path / "photos", count=10, bad=6)
    for fraction, refused in ((0.01, True), (0.9, False)):
        data = DataConfig(source="imagefolder", path=str(images), max_bad_fraction=fraction)
        dataset = ImageFolderDataset(images, 16)
        encode = functools.partial(
            encode_dataset, dataset, PixelVAE(), torch.device("cpu"), 4, 0, False, PassBadFiles.over(data, dataset)
        )
        if refused:
            with pytest.raises(ConfigError, match=r"`data\.path`.*6 of the data set's 16 files \(38%\) are unreadable"):
                encode()
        else:
            assert len(encode()) == 16
