import pytest
import torch
from torch.utils.data import DataLoader

from dit_trainer.data.shapes import ShapesDataset
from dit_trainer.training import GradientFlowError
from dit_trainer.training.run import build_components, build_optimizer, build_trainer
from dit_trainer.training.step import diffusion_loss, drop_captions
from dit_trainer.training.trainer import preflight

from .conftest import TINY_SHAPES, compose_config

CPU = torch.device("cpu")


@pytest.fixture()
def parts():
    torch.manual_seed(0)
    return build_components(compose_config(TINY_SHAPES), CPU, torch.float32)


@pytest.fixture()
def batch():
    return next(iter(DataLoader(ShapesDataset(16, seed=2), batch_size=16)))


def _loss(parts, batch, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    per_sample, _ = diffusion_loss(batch, parts.dit, parts.vae, parts.text_encoder, parts.schedule, generator, 0.1)
    return per_sample


def test_a_step_trains_every_dit_parameter_and_no_frozen_one(parts, batch):
    cfg = compose_config(TINY_SHAPES)
    frozen = dict(parts.vae.named_parameters(prefix="vae")) | dict(parts.text_encoder.named_parameters(prefix="text"))
    optimizer = build_optimizer(cfg, parts.dit)
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in parts.dit.parameters()}
    assert not optimized & {id(p) for p in frozen.values()}
    assert not any(p.requires_grad for p in frozen.values())

    frozen_before = {name: p.detach().clone() for name, p in frozen.items()}
    dit_before = {name: p.detach().clone() for name, p in parts.dit.named_parameters()}
    per_sample = _loss(parts, batch)
    assert per_sample.shape == (16,)
    per_sample.mean().backward()
    optimizer.step()

    unchanged = [n for n, p in parts.dit.named_parameters() if torch.equal(p, dit_before[n])]
    assert unchanged == []
    assert all(torch.equal(p, frozen_before[n]) and p.grad is None for n, p in frozen.items())


def test_the_step_is_reproducible_from_its_generator(parts, batch):
    torch.testing.assert_close(_loss(parts, batch, seed=5), _loss(parts, batch, seed=5), rtol=0, atol=0)
    assert not torch.equal(_loss(parts, batch, seed=5), _loss(parts, batch, seed=6))


def test_caption_dropout_replaces_captions_with_the_empty_prompt():
    captions = [f"caption {i}" for i in range(2000)]
    dropped = drop_captions(captions, 0.25, torch.Generator().manual_seed(0))
    share = sum(c == "" for c in dropped) / len(captions)
    assert 0.2 < share < 0.3
    assert all(d in ("", c) for c, d in zip(captions, dropped))
    assert drop_captions(captions, 0.0, torch.Generator()) == captions


def test_preflight_turns_a_planted_no_grad_into_the_doctor_s_explanation(parts, batch):
    parts.dit.forward = torch.no_grad()(parts.dit.forward)  # the planted bug
    with pytest.raises(GradientFlowError) as caught:
        preflight(parts.dit, lambda: _loss(parts, batch).mean())
    message = str(caught.value)
    assert "[grad_disabled]" in message and "DiTAdapter" in message and "torch.no_grad" in message
    assert not isinstance(caught.value.__cause__, RuntimeError)  # the doctor's words, not PyTorch's error


def test_preflight_names_parameters_that_get_no_gradient(parts, batch):
    parts.dit.transformer.register_parameter("orphan", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(GradientFlowError, match=r"(?s)\[unused_params\].*`transformer\.orphan`"):
        preflight(parts.dit, lambda: _loss(parts, batch).mean())


def test_preflight_refuses_a_fully_frozen_dit(parts, batch):
    parts.dit.requires_grad_(False)
    with pytest.raises(GradientFlowError, match=r"\[no_trainable_params\]"):
        preflight(parts.dit, lambda: _loss(parts, batch).mean())


def test_preflight_passes_a_healthy_step_and_changes_nothing(parts, batch):
    before = {name: p.detach().clone() for name, p in parts.dit.named_parameters()}
    preflight(parts.dit, lambda: _loss(parts, batch).mean())
    assert all(p.grad is None and torch.equal(p, before[n]) for n, p in parts.dit.named_parameters())


@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e6, 0.0])
def test_the_optimizer_steps_on_gradients_clipped_to_max_grad_norm(tmp_path, max_grad_norm):
    """The trainer clips (its own path, not accelerate's) and returns the norm before clipping: the optimizer sees
    min(norm, max_grad_norm), and untouched gradients when the norm is under the limit or clipping is off."""
    cfg = compose_config([*TINY_SHAPES, "monitor.grpo.enabled=false", f"optim.max_grad_norm={max_grad_norm}"])
    trainer = build_trainer(cfg, tmp_path)
    seen = []
    trainer.optimizer.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(
            torch.nn.utils.get_total_norm([p.grad for p in trainer.dit.parameters()])
        )
    )
    _, grad_norm = trainer.train_step(trainer.batches())
    expected = min(grad_norm.item(), max_grad_norm or float("inf"))
    assert grad_norm.item() > 1e-3 and seen[0].item() == pytest.approx(expected, rel=1e-5)
