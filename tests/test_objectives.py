"""Objectives (epsilon, v, flow matching), timestep densities and loss weights: the math on hand-computed tensors,
samplers that recover x0 from a perfect predictor, and short training runs whose loss goes down."""

import math

import pytest
import torch
from diffusers.training_utils import compute_density_for_timestep_sampling

from dit_trainer.components.build import build_components
from dit_trainer.config import DiffusionConfig
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.shapes import ShapesDataset
from dit_trainer.diffusion.families import build_noise_schedule
from dit_trainer.diffusion.loss import diffusion_loss
from dit_trainer.errors import ConfigError
from dit_trainer.training.optim import build_optimizer

from .conftest import TINY_SHAPES, compose_config

FLOW = {"scheduler": "FlowMatchEulerDiscreteScheduler", "objective": "flow_matching", "sampler": "euler"}


def test_flow_matching_noise_and_target_follow_their_definition():
    schedule = build_noise_schedule(DiffusionConfig(**FLOW))
    x0, noise = torch.full((2, 1, 2, 2), 2.0), torch.full((2, 1, 2, 2), -1.0)
    t = torch.tensor([250.0, 1000.0])  # sigma 0.25 and 1
    expected = torch.tensor([0.75 * 2 + 0.25 * -1, -1.0]).view(2, 1, 1, 1).expand_as(x0)
    torch.testing.assert_close(schedule.add_noise(x0, noise, t), expected)
    torch.testing.assert_close(schedule.target(x0, noise, t), torch.full_like(x0, -3.0))


@pytest.mark.parametrize(("objective", "expected"), [("epsilon", "noise"), ("v_prediction", "velocity")])
def test_ddpm_targets_follow_their_definition(objective, expected):
    schedule = build_noise_schedule(DiffusionConfig(objective=objective))
    x0, noise, t = torch.full((1, 1, 2, 2), 2.0), torch.full((1, 1, 2, 2), -1.0), torch.tensor([500])
    a = schedule.scheduler.alphas_cumprod[500]
    torch.testing.assert_close(schedule.add_noise(x0, noise, t), (a.sqrt() * 2 - (1 - a).sqrt()).expand_as(x0))
    target = noise if expected == "noise" else (a.sqrt() * -1 - (1 - a).sqrt() * 2).expand_as(x0)
    torch.testing.assert_close(schedule.target(x0, noise, t), target)


@pytest.mark.parametrize("scheduler", [None, "FlowMatchEulerDiscreteScheduler"])
@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_euler_recovers_x0_from_a_perfect_flow_predictor(scheduler, shift):
    schedule = build_noise_schedule(DiffusionConfig(**{**FLOW, "scheduler": scheduler, "shift": shift}))
    assert schedule.is_fallback == (scheduler is None)
    x0 = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    sampler = schedule.sampler(10, torch.device("cpu"), "euler")
    x = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0))
    for t in sampler.timesteps:
        t_batch = t.reshape(1).expand(3)
        sigma = schedule.sigmas(t_batch, x0)
        noise = (x - (1 - sigma) * x0) / sigma  # the noise that makes x from x0 at this sigma
        x = sampler.step(schedule.target(x0, noise, t_batch), t, x).prev_sample
    torch.testing.assert_close(x, x0, atol=1e-4, rtol=1e-4)


def test_min_snr_weights_equal_the_formula():
    t = torch.tensor([0, 100, 500, 999])
    for objective, denominator in (("epsilon", 0.0), ("v_prediction", 1.0)):
        schedule = build_noise_schedule(DiffusionConfig(objective=objective, snr_gamma=5.0))
        a = schedule.scheduler.alphas_cumprod[t].double()
        snr = a / (1 - a)
        expected = torch.minimum(snr, torch.full_like(snr, 5.0)) / (snr + denominator)
        torch.testing.assert_close(schedule.loss_weights(t).double(), expected, rtol=1e-5, atol=0)
    assert build_noise_schedule(DiffusionConfig()).loss_weights(t) is None


def test_flow_weightings_and_densities_are_diffusers_formulas():
    schedule = build_noise_schedule(DiffusionConfig(**FLOW, flow_weighting="cosmap"))
    t = torch.tensor([250.0, 500.0])
    sigma = t / 1000
    torch.testing.assert_close(schedule.loss_weights(t), 2 / (math.pi * (1 - 2 * sigma + 2 * sigma**2)))
    sqrt = build_noise_schedule(DiffusionConfig(**FLOW, flow_weighting="sigma_sqrt"))
    torch.testing.assert_close(sqrt.loss_weights(t), sigma**-2)
    for kind in ("logit_normal", "mode"):
        cfg = DiffusionConfig(**FLOW, timestep_sampling=kind)
        ours = build_noise_schedule(cfg).sample_timesteps(6, torch.device("cpu"), torch.Generator().manual_seed(4))
        u = compute_density_for_timestep_sampling(kind, 6, 0.0, 1.0, 1.29, generator=torch.Generator().manual_seed(4))
        torch.testing.assert_close(ours, u.clamp(0, 1) * 1000)
    cosmap = DiffusionConfig(**FLOW, timestep_sampling="cosmap")
    t = build_noise_schedule(cosmap).sample_timesteps(4096, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert t.min() >= 0 and t.max() <= 1000 and abs(t.float().median().item() - 500) < 40  # symmetric about 0.5


@pytest.mark.parametrize(
    "overrides",
    [["diffusion.objective=epsilon"], ["diffusion.timestep_sampling=logit_normal", "diffusion.snr_gamma=5"],
     ["diffusion=flow"], ["diffusion=flow", "diffusion.timestep_sampling=mode", "diffusion.flow_weighting=cosmap"],
     ["diffusion=flow", "diffusion.scheduler=null", "diffusion.timestep_sampling=cosmap", "diffusion.shift=3"]],
    ids=["epsilon-uniform", "v-logit_normal-min_snr", "flow-logit_normal", "flow-mode-cosmap", "flow-fallback-cosmap"],
)  # fmt: skip
def test_each_objective_and_density_trains(overrides):
    cfg = compose_config([*TINY_SHAPES, *overrides, "diffusion.objective=flow_matching"] if "diffusion=flow" in
                         overrides else [*TINY_SHAPES, *overrides])  # fmt: skip
    torch.manual_seed(0)
    parts = build_components(cfg, torch.device("cpu"), torch.float32)
    optimizer = build_optimizer(cfg, parts.dit)
    data = ShapesDataset(64, 32, seed=1)
    batch = collate_batch([data[i] for i in range(16)])
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(30):
        loss, _ = diffusion_loss(batch, parts.dit, parts.vae, parts.text_encoder, parts.schedule, generator, 0.1)
        loss.mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.mean().item())
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5]), losses


@pytest.mark.parametrize(
    ("overrides", "key"),
    [(["diffusion=flow", "diffusion.objective=flow_matching", "diffusion.sampler=ddim"], "diffusion.sampler"),
     (["diffusion=flow", "diffusion.objective=flow_matching", "diffusion.snr_gamma=5"], "diffusion.snr_gamma"),
     (["diffusion.flow_weighting=cosmap"], "diffusion.flow_weighting"),
     (["diffusion.timestep_sampling=beta"], "diffusion.timestep_sampling")],
)  # fmt: skip
def test_settings_that_do_not_fit_the_objective_are_refused(overrides, key):
    with pytest.raises(ConfigError, match=f"`{key}`"):
        compose_config([*TINY_SHAPES, *overrides])


def test_learned_variance_outputs_stay_as_loaded_under_weight_decay():
    """The loss ignores the variance half of a learned-sigma DiT: its proj_out rows get zero gradient and no
    weight decay, so they do not drift; the mean half trains."""
    cfg = compose_config([*TINY_SHAPES, "model.learned_sigma=true", "optim.weight_decay=0.1"])
    torch.manual_seed(0)
    parts = build_components(cfg, torch.device("cpu"), torch.float32)
    proj = parts.dit.transformer.proj_out
    assert proj.out_features == parts.dit.transformer.config.patch_size**2 * 2 * parts.latent_shape[0]
    before = proj.weight.detach().clone()
    optimizer = build_optimizer(cfg, parts.dit)
    data = ShapesDataset(16, 32, seed=1)
    batch = collate_batch([data[i] for i in range(8)])
    for _ in range(3):
        loss, _ = diffusion_loss(batch, parts.dit, parts.vae, parts.text_encoder, parts.schedule,
                                 torch.Generator().manual_seed(0), 0.1)  # fmt: skip
        loss.mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    rows = proj.weight.view(parts.dit.transformer.config.patch_size**2, -1, proj.in_features)  # (p*p, 2C, D)
    channels = parts.latent_shape[0]
    assert torch.equal(rows[:, channels:], before.view_as(rows)[:, channels:])  # variance half as loaded
    assert not torch.equal(rows[:, :channels], before.view_as(rows)[:, :channels])  # mean half trains
