"""The optimizer side of a run (``training/optim.py``): the AdamW groups keep weight decay off what the loss does
not train."""

import pytest
import torch

from dit_trainer.components.families import FAMILIES
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.shapes import ShapesDataset
from dit_trainer.diffusion.loss import diffusion_loss
from dit_trainer.training.optim import build_optimizer, optimizer_groups

from ..components.test_meta import FAMILIES as CONDITIONS
from ..conftest import (
    TINY_SHAPES,
    build_tiny_transformer,
    components_of,
    compose_config,
    read_metrics,
    reset_accelerate_state,
)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_is_grouped_for_weight_decay(family):
    """Z-Image's config names no ``out_channels``: its run with weight decay (both shipped recipes) failed with an
    AttributeError before step 1. Every family's trainable parameters land in the groups, once."""
    assert family in CONDITIONS or family == "pixart_sigma", f"add {family}'s condition widths to test_meta.FAMILIES"
    width, pooled = CONDITIONS.get(family, CONDITIONS["pixart_alpha"])
    dit = build_tiny_transformer(family, condition_dim=width, pooled_dim=pooled)
    groups = optimizer_groups(dit, weight_decay=0.1)
    grouped = [id(parameter) for group in groups for parameter in group["params"]]
    assert sorted(grouped) == sorted(id(parameter) for parameter in dit.parameters() if parameter.requires_grad)


def test_learned_variance_outputs_stay_as_loaded_under_weight_decay():
    """The loss ignores the variance half of a learned-sigma DiT: its proj_out rows get zero gradient and no
    weight decay, so they do not drift; the mean half trains."""
    cfg = compose_config([*TINY_SHAPES, "model.learned_sigma=true", "optim.weight_decay=0.1"])
    torch.manual_seed(0)
    parts = components_of(cfg)
    proj = parts.dit.transformer.proj_out
    assert proj.out_features == parts.dit.transformer.config.patch_size**2 * 2 * parts.latent_shape[0]
    before = proj.weight.detach().clone()
    optimizer = build_optimizer(cfg.optim, parts.dit)
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


def test_a_learning_rate_and_weight_decay_changed_on_resuming_are_what_trains(tmp_path):
    """A resume names ``optim.lr`` and ``optim.weight_decay`` among the settings it changed: they must be the ones the
    optimizer then uses, not the checkpoint's (its moments and the schedule's position stay)."""
    from dit_trainer.assemble import build_trainer

    overrides = [*TINY_SHAPES, "data.length=32", "trainer.batch_size=8", "model.num_layers=1", "trainer.log_every=1",
                 "trainer.sample_every=0", "trainer.checkpoint_every=2", "optim.lr_schedule=constant"]  # fmt: skip
    build_trainer(compose_config([*overrides, "trainer.max_steps=2", "optim.lr=1e-3"]), tmp_path).fit()
    reset_accelerate_state()
    changed = ["trainer.max_steps=3", "trainer.resume=latest", "optim.lr=2e-4", "optim.weight_decay=0.5"]
    resumed = build_trainer(compose_config([*overrides, *changed]), tmp_path)
    groups = resumed.update.optimizer.param_groups
    assert [(group["lr"], group["weight_decay"]) for group in groups] == [(2e-4, 0.5)]
    assert resumed.update.optimizer.state  # the checkpoint's moments
    resumed.fit()
    assert [record["lr"] for record in read_metrics(tmp_path)] == [1e-3, 1e-3, 2e-4]
