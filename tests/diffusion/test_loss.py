"""The training loss (``diffusion/loss.py``): it trains every DiT parameter and nothing frozen, draws all its
randomness from one generator, drops captions for classifier-free guidance, stays per sample, and brings the loss
down with each objective and timestep density."""

import pytest
import torch

from dit_trainer.components.conditioners.class_labels import ClassLabels
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.shapes import ShapesDataset
from dit_trainer.diffusion.loss import batch_condition, diffusion_loss, per_sample_mse
from dit_trainer.pixels import to_model_range
from dit_trainer.training.optim import build_optimizer

from ..conftest import TINY_SHAPES, components_of, compose_config, tiny_loss


def test_a_step_trains_every_dit_parameter_and_no_frozen_one(tiny_parts, image_batch):
    cfg = compose_config(TINY_SHAPES)
    vae, text_encoder = tiny_parts.vae, tiny_parts.text_encoder
    frozen = dict(vae.named_parameters(prefix="vae")) | dict(text_encoder.named_parameters(prefix="text"))
    optimizer = build_optimizer(cfg.optim, tiny_parts.dit)
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


def test_caption_dropout_gives_dropped_captions_the_empty_prompts_condition():
    """Class labels make the empty prompt visible: the null class. Encoded and cached captions drop alike."""
    names = [f"class {i}" for i in range(10)]
    labels = ClassLabels(names, torch.device("cpu"))
    captions = [names[i % 10] for i in range(2000)]
    encoded = batch_condition({"caption": captions}, labels, 0.25, torch.Generator().manual_seed(0))
    share = (encoded.sequence == labels.null_class).float().mean().item()
    assert 0.2 < share < 0.3
    kept = encoded.sequence != labels.null_class
    assert torch.equal(encoded.sequence[kept], labels.encode(captions).sequence[kept])
    cached = {"caption": captions, **labels.encode(captions).stored("text_")}
    from_cache = batch_condition(cached, labels, 0.25, torch.Generator().manual_seed(0))
    assert torch.equal(from_cache.sequence, encoded.sequence)
    undropped = batch_condition({"caption": captions}, labels, 0.0, torch.Generator())
    assert torch.equal(undropped.sequence, labels.encode(captions).sequence)


def test_per_sample_loss_has_batch_shape():
    prediction, target = torch.zeros(3, 4, 2, 2), torch.ones(3, 4, 2, 2)
    target[1] = 3
    torch.testing.assert_close(per_sample_mse(prediction, target), torch.tensor([1.0, 9.0, 1.0]))


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
    parts = components_of(cfg)
    optimizer = build_optimizer(cfg.optim, parts.dit)
    data = ShapesDataset(64, 32, seed=1)
    batch = collate_batch([data[i] for i in range(16)])
    with torch.no_grad():  # encoded once, as the latent cache stores them: the steps then run the DiT alone
        mean, std = parts.vae.encode_posterior(to_model_range(batch["image"]))
        text = parts.text_encoder.encode(batch["caption"]).stored("text_")
    batch = {"caption": batch["caption"], "latent_mean": mean, "latent_std": std, **text}
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(30):
        loss, _ = diffusion_loss(batch, parts.dit, parts.vae, parts.text_encoder, parts.schedule, generator, 0.1)
        loss.mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.mean().item())
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5]), losses
