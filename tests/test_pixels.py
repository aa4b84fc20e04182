"""Images travel as uint8 and are normalised on the device (``dit_trainer/pixels.py``): training on them is
numerically identical to training on the float images the host used to normalise, and float images pass unchanged."""

import torch

from dit_trainer.pixels import to_model_range

from .conftest import tiny_loss


def test_uint8_images_normalised_on_the_device_train_exactly_like_host_normalised_floats(tiny_parts, image_batch):
    batch = {"image": image_batch["image"][:4], "caption": image_batch["caption"][:4]}
    pixels = ((batch["image"] + 1) * 127.5).round().to(torch.uint8)  # shapes' own pixels, as a loader gives them
    host = pixels.float() / 127.5 - 1.0  # what the data sources did on the host before
    assert torch.equal(to_model_range(pixels), host) and to_model_range(host) is host
    old, new = {**batch, "image": host}, {**batch, "image": pixels}
    assert torch.equal(tiny_loss(tiny_parts, old, seed=3), tiny_loss(tiny_parts, new, seed=3))
