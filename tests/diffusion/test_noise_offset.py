"""Offset noise (``diffusion.noise_offset``, ``diffusion/loss.py``): each image's noise gets the offset times one
normal draw per channel, constant over the image, drawn from the step's generator after the plain noise; 0 draws
exactly what the loss drew before; flow matching and GRPO refuse it."""

import pytest
import torch
from torch import nn

from dit_trainer.components.conditioners.class_labels import ClassLabels
from dit_trainer.components.vae import PixelVAE
from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion.build import build_noise_schedule
from dit_trainer.diffusion.loss import DiffusionLoss, offset_noise
from dit_trainer.errors import ConfigError

from ..conftest import TINY_SHAPES, compose_config, one_paragraph

SHAPE = (64, 4, 8, 8)


def test_zero_offset_draws_exactly_the_plain_noise():
    latents = torch.zeros(SHAPE)
    generator, plain = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(offset_noise(latents, 0.0, generator), torch.randn(SHAPE, generator=plain))
    assert torch.equal(generator.get_state(), plain.get_state())  # what the step draws next is unchanged too


def test_the_offset_is_one_draw_per_image_and_channel_scaled_by_noise_offset():
    latents = torch.zeros(SHAPE)
    noise = offset_noise(latents, 0.1, torch.Generator().manual_seed(4))
    replay = torch.Generator().manual_seed(4)
    plain = torch.randn(SHAPE, generator=replay)
    offset = torch.randn(SHAPE[:2], generator=replay)
    torch.testing.assert_close(noise - plain, 0.1 * offset[..., None, None].expand(SHAPE), rtol=0, atol=1e-6)
    assert 0.07 < offset.mul(0.1).std().item() < 0.13


class ZeroDiT(nn.Module):
    """A DiT that predicts 0: the epsilon loss is then the mean square of the noise the loss trained on."""

    def forward(self, noisy: torch.Tensor, timesteps: torch.Tensor, condition) -> torch.Tensor:
        return torch.zeros_like(noisy)


def test_the_training_loss_trains_on_the_offset_noise():
    schedule = build_noise_schedule(DiffusionConfig(objective="epsilon"))
    labels = ClassLabels(["x"], torch.device("cpu"))
    batch = {"image": torch.full((16, 3, 4, 4), 128, dtype=torch.uint8), "caption": ["x"] * 16}

    def loss(**options) -> torch.Tensor:
        objective = DiffusionLoss(PixelVAE(), labels, schedule, caption_dropout=0.0, **options)
        return objective(batch, ZeroDiT(), torch.Generator().manual_seed(9))[0]

    assert torch.equal(loss(noise_offset=0.0), loss())
    replay = torch.Generator().manual_seed(9)
    plain = torch.randn((16, 3, 4, 4), generator=replay)
    offset = torch.randn((16, 3, 1, 1), generator=replay)
    torch.testing.assert_close(loss(noise_offset=0.5), (plain + 0.5 * offset).pow(2).flatten(1).mean(1))


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            ["diffusion=flow", "diffusion.objective=flow_matching", "diffusion.noise_offset=0.1"],
            "rectified flow's path ends at pure noise",
        ),
        (["diffusion.noise_offset=-0.1"], "it must be >= 0"),
    ],
)
def test_noise_offset_is_refused_where_it_has_no_meaning(overrides, says):
    with pytest.raises(ConfigError) as refused:
        compose_config([*TINY_SHAPES, *overrides])
    assert says in one_paragraph(refused.value, "diffusion.noise_offset")
