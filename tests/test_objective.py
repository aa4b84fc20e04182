"""The model-specific step (``training/objective.py``): it trains every DiT parameter and nothing frozen, draws
all its randomness from one generator, and drops captions for classifier-free guidance."""

import torch

from dit_trainer.diffusion.loss import drop_captions
from dit_trainer.training.optim import build_optimizer

from .conftest import TINY_SHAPES, compose_config, tiny_loss


def test_a_step_trains_every_dit_parameter_and_no_frozen_one(tiny_parts, image_batch):
    cfg = compose_config(TINY_SHAPES)
    vae, text_encoder = tiny_parts.vae, tiny_parts.text_encoder
    frozen = dict(vae.named_parameters(prefix="vae")) | dict(text_encoder.named_parameters(prefix="text"))
    optimizer = build_optimizer(cfg, tiny_parts.dit)
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in tiny_parts.dit.parameters()}
    assert not optimized & {id(p) for p in frozen.values()}
    assert not any(p.requires_grad for p in frozen.values())

    frozen_before = {name: p.detach().clone() for name, p in frozen.items()}
    dit_before = {name: p.detach().clone() for name, p in tiny_parts.dit.named_parameters()}
    per_sample = tiny_loss(tiny_parts, image_batch)
    assert per_sample.shape == (16,)
    per_sample.mean().backward()
    optimizer.step()

    unchanged = [n for n, p in tiny_parts.dit.named_parameters() if torch.equal(p, dit_before[n])]
    assert unchanged == []
    assert all(torch.equal(p, frozen_before[n]) and p.grad is None for n, p in frozen.items())


def test_the_step_is_reproducible_from_its_generator(tiny_parts, image_batch):
    torch.testing.assert_close(
        tiny_loss(tiny_parts, image_batch, seed=5), tiny_loss(tiny_parts, image_batch, seed=5), rtol=0, atol=0
    )
    assert not torch.equal(tiny_loss(tiny_parts, image_batch, seed=5), tiny_loss(tiny_parts, image_batch, seed=6))


def test_caption_dropout_replaces_captions_with_the_empty_prompt():
    captions = [f"caption {i}" for i in range(2000)]
    dropped = drop_captions(captions, 0.25, torch.Generator().manual_seed(0))
    share = sum(c == "" for c in dropped) / len(captions)
    assert 0.2 < share < 0.3
    assert all(d in ("", c) for c, d in zip(captions, dropped))
    assert drop_captions(captions, 0.0, torch.Generator()) == captions
