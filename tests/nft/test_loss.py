"""DiffusionNFT's loss (``nft/loss.py``) and the x0 a prediction implies (``NoiseSchedule.predicted_x0``), on which
the loss rests for every objective."""

import pytest
import torch

from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion.build import build_noise_schedule
from dit_trainer.nft.loss import adaptive_error, nft_loss, optimality

OBJECTIVES = [
    {"objective": "epsilon"},
    {"objective": "v_prediction"},
    {"objective": "flow_matching", "scheduler": None, "sampler": "euler"},
]


@pytest.mark.parametrize("settings", OBJECTIVES, ids=lambda s: s["objective"])
def test_the_target_implies_the_clean_latents_it_was_made_from(settings):
    schedule = build_noise_schedule(DiffusionConfig(**settings)).at_size((4, 8, 8))
    generator = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(6, 4, 8, 8, generator=generator), torch.randn(6, 4, 8, 8, generator=generator)
    timesteps = schedule.sample_timesteps(6, torch.device("cpu"), generator)
    x_t = schedule.add_noise(x0, noise, timesteps)
    recovered = schedule.predicted_x0(schedule.target(x0, noise, timesteps), x_t, timesteps)
    assert torch.allclose(recovered, x0, atol=1e-3)


def test_optimality_maps_clipped_advantages_onto_zero_to_one():
    advantages = torch.tensor([-9.0, -5.0, 0.0, 2.5, 5.0, 9.0])
    assert optimality(advantages, 5.0).tolist() == [0.0, 0.0, 0.5, 0.75, 1.0, 1.0]


def test_the_loss_pulls_towards_the_images_with_r_one_and_pushes_from_those_with_r_zero():
    """At x0_trained = x0_old (the first update), the gradient with r = 1 points the trained prediction towards the
    clean latents, with r = 0 away from them, and with r = 1/2 the two cancel."""
    generator = torch.Generator().manual_seed(1)
    x0 = torch.randn(3, 4, 8, 8, generator=generator)
    old = x0 + 0.5 * torch.randn(3, 4, 8, 8, generator=generator)
    trained = old.clone().requires_grad_(True)
    nft_loss(x0, old, trained, torch.tensor([1.0, 0.0, 0.5]), beta=1.0).sum().backward()
    towards = (trained.grad * (old - x0)).flatten(1).sum(dim=1)  # > 0: descending moves trained towards x0
    assert towards[0] > 0 and towards[1] < 0 and abs(towards[2]) < 1e-5


def test_the_adaptive_error_weighs_rows_alike_whatever_their_scale():
    x0 = torch.zeros(2, 4, 8, 8)
    x0_hat = torch.stack([torch.full((4, 8, 8), 0.1), torch.full((4, 8, 8), 10.0)])
    assert torch.allclose(adaptive_error(x0_hat, x0), torch.tensor([0.1, 10.0]))
