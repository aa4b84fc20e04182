"""Differential privacy (``training/parallel/privacy.py``): per-sample gradients and clipping against a
one-sample-at-a-time reference, a noise-only step, non-finite private gradients, the accountant through logs and resume,
and models that are refused."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from opacus.accountants import PRVAccountant
from torch.func import functional_call, grad, vmap
from torch.utils.data import TensorDataset

from dit_trainer.assemble import build_trainer
from dit_trainer.components.modulation import expose_modulation_tables
from dit_trainer.condition import Condition
from dit_trainer.config import PrivacyConfig
from dit_trainer.diffusion.loss import per_sample_mse
from dit_trainer.errors import ConfigError
from dit_trainer.training.parallel.privacy import check_model, make_private, noise_multiplier
from tests.conftest import TINY_BATCH, TINY_CONDITION_DIM, TINY_SHAPES, compose_config, tiny_batch


def per_sample_loss(dit, x, t, condition, target) -> torch.Tensor:
    return per_sample_mse(dit(x, t, condition), target)


def one_sample(batch: tuple, i: int) -> tuple:
    """Sample ``i`` of ``tiny_batch()``, as a batch of one."""
    x, t, condition, target = batch
    return x[i : i + 1], t[i : i + 1], condition.rows(slice(i, i + 1)), target[i : i + 1]


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_per_sample_norms_and_clipping_match_one_sample_at_a_time(mode, tiny_transformer):
    dit = tiny_transformer(condition_dim=TINY_CONDITION_DIM)
    expose_modulation_tables(dit.transformer)
    max_grad_norm = 2.0
    cfg = PrivacyConfig(enabled=True, max_grad_norm=max_grad_norm, noise_multiplier=1.0, mode=mode)
    optimizer = torch.optim.SGD(dit.parameters(), lr=0.1)
    private, dp_optimizer, _ = make_private(
        cfg, dit, optimizer, TensorDataset(torch.arange(60)), 6, 10, 0, {}, torch.device("cpu")
    )
    params = dp_optimizer.params
    assert len(params) == len(list(dit.parameters()))  # every parameter is clipped: none excluded or frozen
    batch = tiny_batch()

    reference = []
    with private.hooks_paused():
        for i in range(TINY_BATCH):
            loss = per_sample_loss(dit, *one_sample(batch, i)).sum()
            reference.append(torch.autograd.grad(loss, params))
    norms = torch.stack([torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) for grads in reference])
    assert (norms > max_grad_norm).any() and (norms < max_grad_norm).any(), norms  # clipping bites, not always
    factors = (max_grad_norm / norms).clamp(max=1.0)
    clipped_sum = [sum(f * grads[k] for f, grads in zip(factors, reference)) for k in range(len(params))]

    private.backward(per_sample_loss(dit, *batch))
    if mode == "ghost":
        dp_norms = private.hooks.per_sample_gradient_norms
        summed = [p.grad for p in params]
        coefficients = private.hooks.get_clipping_coef()
    else:
        dp_norms = torch.stack([p.grad_sample.flatten(1).norm(dim=1) for p in params], dim=1).norm(dim=1)
        dp_optimizer.clip_and_accumulate()
        summed = [p.summed_grad for p in params]
        coefficients = (max_grad_norm / (dp_norms + 1e-6)).clamp(max=1.0)  # as DPOptimizer.clip_and_accumulate
    torch.testing.assert_close(dp_norms, norms, rtol=1e-4, atol=1e-6)
    assert (coefficients * dp_norms <= max_grad_norm * (1 + 1e-5)).all()  # each contribution within the norm
    # The clipped sum the optimizer adds noise to is the sum of the reference gradients, each clipped.
    for got, want in zip(summed, clipped_sum):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


# The families that allow DP-SGD, with their condition widths (sequence, pooled); Sana refuses it.
PRIVATE_FAMILIES = {"dit": (10, None), "dit_diffusers_layout": (10, None), "pixart_alpha": (12, None),
                    "sd3": (12, 12), "flux": (12, 12)}  # fmt: skip


def private_family_batch(family: str, generator: torch.Generator) -> tuple:
    """(x_t, t, condition, target) of 4 samples for ``PRIVATE_FAMILIES[family]``: class ids for the DiT."""
    sequence, pooled = PRIVATE_FAMILIES[family]
    x, t = torch.randn(4, 4, 8, 8, generator=generator), torch.randint(0, 1000, (4,), generator=generator)
    if family.startswith("dit"):
        condition = Condition(torch.randint(0, sequence, (4,), generator=generator), torch.ones(4, 1))
    else:
        pooled = None if pooled is None else torch.randn(4, pooled, generator=generator)
        condition = Condition(torch.randn(4, 5, sequence, generator=generator), torch.ones(4, 5), pooled)
    return x, t, condition, torch.randn(4, 4, 8, 8, generator=generator)


def torch_func_per_sample_gradients(dit, batch: tuple) -> dict[str, torch.Tensor]:
    """The reference: each sample's gradient of the trainer's per-sample loss with respect to every trainable
    parameter of the whole model (a shared one once, under its first name), by ``vmap(grad(...))`` of a
    ``functional_call``: no hooks, no per-layer formulas."""
    params = {name: p.detach() for name, p in dit.named_parameters() if p.requires_grad}
    x, t, condition, target = batch

    def loss(params, x, t, condition, target):
        one = Condition(*(None if field is None else field[None] for field in condition))
        return per_sample_mse(functional_call(dit, params, (x[None], t[None], one)), target[None])[0]

    fields = Condition(*(None if field is None else 0 for field in condition))  # no pooled vector: none to map
    return vmap(grad(loss), in_dims=(None, 0, 0, fields, 0))(params, x, t, condition, target)


def private_transformer(family: str, build) -> object:
    """A tiny transformer of ``family`` as the trainer prepares it for DP; the DiT has 3 blocks sharing one
    embedder, or (``dit_diffusers_layout``) an embedder of each block's own, as DiT weights saved by diffusers."""
    sequence, pooled = PRIVATE_FAMILIES[family]
    layers = 3 if family.startswith("dit") else 1
    dit = build(family.removesuffix("_diffusers_layout"), condition_dim=sequence, pooled_dim=pooled, num_layers=layers)
    blocks = dit.transformer.transformer_blocks
    if family == "dit_diffusers_layout":
        for block in blocks[1:]:
            block.norm1.emb = copy.deepcopy(blocks[0].norm1.emb)
            for parameter in block.norm1.emb.parameters():
                parameter.data += 0.1 * torch.randn_like(parameter)
    elif family == "dit":
        assert all(block.norm1.emb is blocks[0].norm1.emb for block in blocks)
    if dit.family.prepare_private is not None:
        dit.family.prepare_private(dit.transformer)
    return dit


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
@pytest.mark.parametrize("family", sorted(PRIVATE_FAMILIES))
def test_per_sample_gradient_norms_match_torch_func(family, mode, tiny_transformer):
    """Opacus' per-sample gradient norms, as the trainer wires it (the family's ``prepare_private``, then
    ``make_private``), against torch.func's of the whole model. The DiT's embedder is called by each block and by
    the output layer: before it ran once per forward and was hooked once, hooks mode counted its per-sample gradients
    once per block (norms up to 49 % too large with these 3 blocks) and ghost clipping refused the model."""
    dit = private_transformer(family, tiny_transformer)
    batch = private_family_batch(family, torch.Generator().manual_seed(1))
    reference = torch_func_per_sample_gradients(copy.deepcopy(dit), batch)  # functional_call swaps parameters
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in reference.values()], dim=1).norm(dim=1)

    cfg = PrivacyConfig(enabled=True, max_grad_norm=1.0, noise_multiplier=1.0, mode=mode)
    optimizer = torch.optim.SGD(dit.parameters(), lr=0.1)
    private, dp_optimizer, _ = make_private(
        cfg, dit, optimizer, TensorDataset(torch.arange(40)), 4, 10, 0, {}, torch.device("cpu")
    )
    x, t, condition, target = batch
    private.backward(per_sample_mse(dit(x, t, condition), target))
    if mode == "ghost":
        torch.testing.assert_close(private.hooks.per_sample_gradient_norms, norms, rtol=1e-5, atol=1e-6)
        return
    names = {id(p): name for name, p in dit.named_parameters()}
    stored = {names[id(p)]: p.grad_sample for p in dp_optimizer.params}
    assert stored.keys() == reference.keys()
    for name, per_sample in reference.items():  # each parameter's, the shared embedder's included
        torch.testing.assert_close(stored[name], per_sample, rtol=1e-4, atol=1e-6, msg=name)


def test_empty_draw_is_a_noise_only_step(tiny_transformer):
    dit = tiny_transformer(condition_dim=TINY_CONDITION_DIM)
    expose_modulation_tables(dit.transformer)
    cfg = PrivacyConfig(enabled=True, noise_multiplier=1.0)
    before = [p.detach().clone() for p in dit.parameters()]
    private, dp_optimizer, _ = make_private(
        cfg, dit, torch.optim.SGD(dit.parameters(), lr=0.1), TensorDataset(torch.arange(60)), 6, 10, 0, {},
        torch.device("cpu"),
    )  # fmt: skip
    private.backward_empty()
    dp_optimizer.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, dit.parameters()))  # noise moved every parameter
    assert private.engine.accountant.history == [(1.0, 0.1, 1)]


@pytest.mark.parametrize("mode", ["ghost", "hooks"])
def test_a_non_finite_private_gradient_is_skipped_not_applied(mode):
    """A finite loss can still give a NaN/inf gradient (here the square root's slope at 0); clipping does not make
    it finite (0 x inf), so the guard must see the clipped and noised gradient before the optimizer applies it."""
    from accelerate import Accelerator

    from dit_trainer.training.nonfinite import NonFiniteGuard
    from dit_trainer.training.state.training_state import TrainingState
    from dit_trainer.training.update import PrivateUpdate

    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = PrivacyConfig(enabled=True, noise_multiplier=1.0, mode=mode)
    private, dp_optimizer, _ = make_private(
        cfg, model, optimizer, TensorDataset(torch.arange(60)), 6, 10, 0, {}, torch.device("cpu")
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    update = PrivateUpdate(private, torch.device("cpu"), dp_optimizer, schedule, list(model.parameters()))
    guard = NonFiniteGuard(Accelerator(cpu=True), model, TrainingState(torch.Generator()), 3, [], update.current_lr)
    loss = update.backward(model(torch.ones(4, 1)).squeeze(1).sqrt())
    grad_norm = update.norm_before_step()
    finite = guard.check(loss, grad_norm)
    update.step(grad_norm, finite)
    assert loss == 0 and not finite and guard.state.skipped_steps == 1
    assert torch.equal(model.weight, torch.zeros(1, 1))  # the update was not applied


def test_noise_for_target_epsilon_and_budget_overrun():
    cfg = PrivacyConfig(enabled=True, target_epsilon=4.0, epochs=2.0)
    sigma = noise_multiplier(cfg, sample_rate=0.1, max_steps=20, delta=1e-3)
    accountant = PRVAccountant()
    for _ in range(20):
        accountant.step(noise_multiplier=sigma, sample_rate=0.1)
    assert accountant.get_epsilon(1e-3) == pytest.approx(4.0, abs=0.1)
    with pytest.raises(ConfigError, match=r"privacy.epochs.*calibrated for 20 steps.*max_steps. is 30"):
        noise_multiplier(cfg, sample_rate=0.1, max_steps=30, delta=1e-3)


def test_batchnorm_is_refused_with_the_fix(tiny_transformer):
    dit = tiny_transformer(condition_dim=TINY_CONDITION_DIM)
    dit.transformer.pos_norm = torch.nn.BatchNorm2d(4)
    with pytest.raises(ConfigError, match=r"privacy.enabled.*BatchNorm.*GroupNorm"):
        check_model(dit)


class Gain(torch.nn.Module):
    """A layer whose weight Opacus has no grad sampler for (as an SD3.5 attention's qk-norm once had none)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))


def test_a_layer_without_a_grad_sampler_is_refused_naming_its_type_not_batchnorm(tiny_transformer):
    """It was told to replace BatchNorm, which the model did not have."""
    dit = tiny_transformer(condition_dim=TINY_CONDITION_DIM)
    expose_modulation_tables(dit.transformer)  # as make_private does: PixArt's own tables then have samplers
    dit.transformer.gain = Gain()
    with pytest.raises(ConfigError) as caught:
        check_model(dit)
    message = str(caught.value)
    assert "transformer.gain.weight (Opacus has no grad sampler for Gain)" in message and "freeze those" in message
    assert "BatchNorm" not in message


TINY_DP = [*TINY_SHAPES, "privacy.enabled=true", "privacy.noise_multiplier=1.0", "trainer.ema_decay=0.9"]


@pytest.mark.slow
def test_epsilon_is_logged_saved_and_continues_after_resume(tmp_path):
    overrides = [*TINY_DP, "trainer.max_steps=4", "trainer.log_every=2", "trainer.checkpoint_every=2"]
    full = build_trainer(compose_config(overrides), tmp_path / "full")
    full.fit()
    sample_rate = 1 / (256 // 16)
    accountant = PRVAccountant()
    expected = {}
    for step in range(1, 5):
        accountant.step(noise_multiplier=1.0, sample_rate=sample_rate)
        expected[step] = accountant.get_epsilon(1 / 256)
    logged = {r["step"]: r["privacy/epsilon"] for r in map(json.loads, (tmp_path / "full/metrics.jsonl").open())}
    assert logged == pytest.approx({2: expected[2], 4: expected[4]}, rel=1e-6)
    assert logged[4] > logged[2]
    saved = json.loads((tmp_path / "full/checkpoints/checkpoint-2/privacy_accountant.json").read_text())
    assert saved["history"] == [[1.0, sample_rate, 2]]

    interrupted = tmp_path / "interrupted"
    build_trainer(compose_config([*overrides, "trainer.max_steps=2"]), interrupted).fit()
    resumed = build_trainer(compose_config([*overrides, "trainer.resume=latest"]), interrupted)
    assert resumed.state.step == 2 and resumed.update.privacy.epsilon() == pytest.approx(expected[2], rel=1e-6)
    resumed.fit()
    assert resumed.update.privacy.epsilon() == pytest.approx(expected[4], rel=1e-6)
    for a, b in zip(full.dit.parameters(), resumed.dit.parameters()):  # same batches, noise and steps
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_dp_lora_trains_only_the_adapters(tmp_path, tiny_pixart_dir):
    overrides = [*TINY_DP, f"model.pretrained={tiny_pixart_dir}", "lora.enabled=true", "lora.rank=4",
                 "trainer.max_steps=2"]  # fmt: skip
    trainer = build_trainer(compose_config(overrides), tmp_path)
    before = {name: p.detach().clone() for name, p in trainer.dit.named_parameters()}
    trainer.fit()
    changed = {name for name, p in trainer.dit.named_parameters() if not torch.equal(before[name], p)}
    trainable = {name for name, p in trainer.dit.named_parameters() if p.requires_grad}
    assert changed == trainable and all("lora_" in name for name in changed)
