"""GRPO's update (``dit_trainer/grpo``): the log-probs a training forward recomputes are those the rollout drew, the
clipped loss moves the policy in the advantage's direction and no further than the clip range, the KL reference is
the starting model, and groups without a reward spread carry no signal."""

import contextlib
import dataclasses
import importlib
import sys
import warnings

import pytest
import torch

from dit_trainer.components.dit import build_dit
from dit_trainer.components.lora import apply_lora
from dit_trainer.config import DiffusionConfig, LoRAConfig, ModelConfig, TrainConfig
from dit_trainer.diffusion.families import build_noise_schedule
from dit_trainer.grpo.build import build_policy
from dit_trainer.grpo.loss import clipped_policy_loss, gaussian_kl, ratio_statistics
from dit_trainer.grpo.reference import build_reference
from dit_trainer.grpo.rollout import Rollout, recompute_steps, roll_out
from dit_trainer.grpo.trainer import steps_to_train
from dit_trainer.rewards.grpo import group_statistics

CPU = torch.device("cpu")
PROMPTS = ["a red circle", "a blue square", "a green triangle"]
GROUP, STEPS, GUIDANCE, CLIP = 4, 6, 3.0, 1e-4
FLOW = {"objective": "flow_matching", "scheduler": None, "sampler": "euler"}


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: threads only contend on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _policy(schedule, noise_level=None):
    """The rollout sampler: every step stochastic but the last."""
    stochastic = torch.ones(STEPS, dtype=torch.bool)
    stochastic[-1] = False
    return schedule.policy(STEPS, CPU, noise_level, stochastic)


def _schedule(family: str, parts):
    if family == "ddim":
        return parts.schedule  # v-prediction DDPM
    with warnings.catch_warnings():  # the fallback's warning is not what these tests check
        warnings.simplefilter("ignore", UserWarning)
        return build_noise_schedule(DiffusionConfig(**FLOW))


def _roll_out(parts, policy, prompts=PROMPTS, group_size=GROUP, seed=0) -> Rollout:
    """prompts x G trajectories, 5 at a time (batches split unevenly, across groups), from the dit in eval mode."""
    parts.dit.eval()
    generator = torch.Generator().manual_seed(seed)
    text_encoder, shape = parts.text_encoder, parts.latent_shape
    return roll_out(parts.dit, policy, text_encoder, prompts, group_size, shape, GUIDANCE, generator, batch_size=5)


def _trained_rows(policy, trajectories: torch.Tensor, shuffle: int | None = None):
    """(rows, steps): every trained (stochastic) step of ``trajectories``, optionally shuffled."""
    trained = torch.nonzero(policy.stochastic).flatten()
    rows = trajectories.repeat_interleave(len(trained))
    steps = trained.repeat(len(trajectories))
    if shuffle is not None:
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(shuffle))
        rows, steps = rows[order], steps[order]
    return rows, steps


@pytest.mark.parametrize("family", ["ddim", "flow"])
def test_recomputed_log_probs_are_the_rollouts_and_the_first_ratio_is_one(tiny_parts, family):
    """With the weights that rolled out, one shuffled batch of every (trajectory, trained step) recomputes each
    step's log-prob to within 1e-5, whatever rollout batch it was drawn in; so the first update's ratio is 1 and
    nothing is clipped even at clip range 1e-4."""
    policy = _policy(_schedule(family, tiny_parts))
    assert policy.stochastic[:-1].all() and not policy.stochastic[-1]
    rollout = _roll_out(tiny_parts, policy)
    count = len(PROMPTS) * GROUP
    assert rollout.samples.shape == (count, STEPS + 1, *tiny_parts.latent_shape)
    assert rollout.log_probs.shape == (count, STEPS) and not rollout.log_probs[:, -1].any()
    assert rollout.log_probs[:, :-1].ne(0).all()

    rows, steps = _trained_rows(policy, torch.arange(count), shuffle=0)
    with torch.no_grad():
        log_prob, mean, std = recompute_steps(tiny_parts.dit, policy, rollout, rows, steps, GUIDANCE)
    old = rollout.log_probs[rows, steps]
    assert log_prob.shape == (len(rows),) and (std > 0).all()
    assert (log_prob - old).abs().max() <= 1e-5
    # The recomputation really is of each row's own step: a wrong trajectory or step would not be this close.
    assert (log_prob - rollout.log_probs[rows.roll(1), steps]).abs().max() > 1e-3
    assert (log_prob - rollout.log_probs[rows, steps.roll(1)]).abs().max() > 1e-3

    advantages = torch.linspace(-1, 1, count)[rows]
    ratio = ratio_statistics(log_prob, old, CLIP)
    assert ratio["clip_frac"] == 0
    assert abs(ratio["ratio_min"] - 1) <= 1e-5 and abs(ratio["ratio_max"] - 1) <= 1e-5
    torch.testing.assert_close(clipped_policy_loss(log_prob, old, advantages, CLIP), -advantages, rtol=0, atol=1e-5)


def test_the_clip_stops_the_gradient_only_past_the_range_in_the_advantages_direction():
    """PPO's pessimistic clip: a ratio past 1 + c with A > 0 (or below 1 - c with A < 0) has zero gradient w.r.t. the
    log-prob; within the range, or past it against the advantage, the gradient is -A r. clip_frac counts |r - 1| > c."""
    c = 0.2
    ratio = torch.tensor([1.0, 1.1, 1.3, 0.5, 0.9, 1.5, 0.5], dtype=torch.float64)
    advantages = torch.tensor([1.0, 2.0, 1.0, -1.0, -2.0, -3.0, 0.5], dtype=torch.float64)
    clipped = torch.tensor([False, False, True, True, False, False, False])
    old = torch.tensor([0.3, -1.0, 2.0, 0.0, -0.5, 1.0, -2.0], dtype=torch.float64)
    log_prob = (old + ratio.log()).requires_grad_(True)

    loss = clipped_policy_loss(log_prob, old, advantages, c)
    expected = torch.where(clipped, -advantages * ratio.clamp(1 - c, 1 + c), -advantages * ratio)
    torch.testing.assert_close(loss.detach(), expected)
    loss.sum().backward()
    torch.testing.assert_close(log_prob.grad, torch.where(clipped, 0.0, -advantages * ratio))
    assert (log_prob.grad[clipped] == 0).all() and (log_prob.grad[~clipped] != 0).all()

    stats = ratio_statistics(log_prob, old, c)
    assert stats["clip_frac"].item() == pytest.approx(4 / 7)  # 1.3, 0.5, 1.5, 0.5
    assert stats["approx_kl"].item() == pytest.approx(0.5 * (ratio.log() ** 2).mean().item())
    assert stats["ratio_min"].item() == pytest.approx(0.5) and stats["ratio_max"].item() == pytest.approx(1.5)
    assert stats["ratio_mean"].item() == pytest.approx(ratio.mean().item())
    assert not stats["clip_frac"].requires_grad
    zero = ratio_statistics(old.clone(), old, c)
    assert zero["clip_frac"] == 0 and zero["approx_kl"] == 0


def test_a_positive_advantage_raises_its_trajectorys_log_probs_and_zero_advantages_give_no_gradient(tiny_parts):
    """One SGD step on the clipped loss of a trajectory with advantage +1 makes its steps more likely (mean log-prob
    up), one with -1 less likely; with all advantages 0 every parameter's gradient is exactly zero."""
    policy = _policy(tiny_parts.schedule)
    rollout = _roll_out(tiny_parts, policy, PROMPTS[:1], group_size=2)
    dit = tiny_parts.dit
    rows, steps = _trained_rows(policy, torch.tensor([1]))
    old = rollout.log_probs[rows, steps]
    initial = {name: p.detach().clone() for name, p in dit.named_parameters()}

    def step(advantage: float) -> torch.Tensor:
        """The change of trajectory 1's mean trained-step log-prob after one SGD step at ``advantage``."""
        with torch.no_grad():
            for name, p in dit.named_parameters():
                p.copy_(initial[name])
        advantages = torch.tensor([0.0, advantage])
        dit.zero_grad(set_to_none=True)
        log_prob = recompute_steps(dit, policy, rollout, rows, steps, GUIDANCE)[0]
        clipped_policy_loss(log_prob, old, advantages[rows], CLIP).mean().backward()
        torch.optim.SGD(dit.parameters(), lr=1e-2).step()
        with torch.no_grad():
            after = recompute_steps(dit, policy, rollout, rows, steps, GUIDANCE)[0]
        return after.mean() - log_prob.detach().mean()

    assert step(1.0) > 1e-5
    assert step(-1.0) < -1e-5

    with torch.no_grad():
        for name, p in dit.named_parameters():
            p.copy_(initial[name])
    dit.zero_grad(set_to_none=True)
    all_rows, all_steps = _trained_rows(policy, torch.arange(2))
    log_prob = recompute_steps(dit, policy, rollout, all_rows, all_steps, GUIDANCE)[0]
    old = rollout.log_probs[all_rows, all_steps]
    clipped_policy_loss(log_prob, old, torch.zeros(len(all_rows)), CLIP).mean().backward()
    grads = [p.grad for p in dit.parameters()]
    assert any(g is not None for g in grads)  # the graph did reach the parameters
    assert all(g is None or not g.any() for g in grads)


def test_gaussian_kl_is_the_mean_squared_gap_over_twice_the_variance():
    """KL of two Gaussians with one std: (m - m_ref)^2 / (2 std^2) averaged over dimensions; 0 for equal means."""
    generator = torch.Generator().manual_seed(0)
    mean, reference = torch.randn(3, 4, 2, 2, generator=generator), torch.randn(3, 4, 2, 2, generator=generator)
    std = torch.tensor([0.5, 1.0, 2.0]).view(3, 1, 1, 1)
    assert torch.equal(gaussian_kl(mean, mean, std), torch.zeros(3))
    normal = torch.distributions.Normal
    expected = torch.distributions.kl_divergence(normal(mean, std), normal(reference, std)).mean(dim=(1, 2, 3))
    torch.testing.assert_close(gaussian_kl(mean, reference, std), expected)


def test_full_fine_tuning_reference_is_a_frozen_copy_of_the_starting_weights(tiny_parts):
    """Before any change the reference's step means are the dit's exactly (KL 0); after the dit's weights move the
    KL is positive while the reference, a frozen copy, still gives the starting means."""
    policy = _policy(tiny_parts.schedule)
    rollout = _roll_out(tiny_parts, policy, PROMPTS[:1], group_size=2)
    dit = tiny_parts.dit
    reference = build_reference(dit, lora=False, autocast=contextlib.nullcontext)
    rows, steps = _trained_rows(policy, torch.arange(2))

    _, mean, std = recompute_steps(dit, policy, rollout, rows, steps, GUIDANCE)
    _, reference_mean, _ = recompute_steps(reference, policy, rollout, rows, steps, GUIDANCE)
    assert mean.requires_grad and not reference_mean.requires_grad
    assert torch.equal(mean, reference_mean)
    assert torch.equal(gaussian_kl(mean, reference_mean, std), torch.zeros(len(rows)))

    reference_parameters = list(reference.model.parameters())
    assert not any(p.requires_grad for p in reference_parameters)
    assert not {p.data_ptr() for p in reference_parameters} & {p.data_ptr() for p in dit.parameters()}
    with torch.no_grad():
        generator = torch.Generator().manual_seed(1)
        for p in dit.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    _, moved, _ = recompute_steps(dit, policy, rollout, rows, steps, GUIDANCE)
    _, reference_after, _ = recompute_steps(reference, policy, rollout, rows, steps, GUIDANCE)
    assert torch.equal(reference_after, reference_mean)
    assert (gaussian_kl(moved, reference_after, std) > 0).all()


def test_lora_reference_is_the_base_model_and_leaves_the_adapters_training():
    """Under LoRA the reference is the dit with its adapters off: the base model's prediction, not the adapted one.
    Called between a forward and its backward (as the KL term is), it leaves the adapters active and training."""
    torch.manual_seed(0)
    model = ModelConfig(num_layers=2, num_attention_heads=4, attention_head_dim=32, patch_size=4)
    dit = build_dit(model, in_channels=4, sample_size=16, condition_dim=384).eval()
    generator = torch.Generator().manual_seed(0)
    x, t = torch.randn(2, 4, 16, 16, generator=generator), torch.tensor([500, 200])
    embeds, mask = torch.randn(2, 8, 384, generator=generator), torch.ones(2, 8, dtype=torch.long)
    with torch.no_grad():
        base = dit(x, t, embeds, mask)

    apply_lora(dit.transformer, LoRAConfig(rank=4, target_modules=["to_q", "to_v"]))
    adapters = {name: p for name, p in dit.named_parameters() if "lora_" in name}
    assert adapters and all(p.requires_grad for p in adapters.values())
    with torch.no_grad():
        for name, p in adapters.items():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=generator)
    adapted = dit(x, t, embeds, mask)
    assert (adapted - base).abs().max() > 1e-3

    reference = build_reference(dit, lora=True, autocast=contextlib.nullcontext)
    prediction = reference(x, t, embeds, mask)
    assert not prediction.requires_grad
    torch.testing.assert_close(prediction, base, rtol=0, atol=1e-6)

    assert all(p.requires_grad for p in adapters.values())
    torch.testing.assert_close(dit(x, t, embeds, mask).detach(), adapted.detach(), rtol=0, atol=1e-6)
    ((adapted - prediction) ** 2).mean().backward()
    assert all(p.grad is not None for p in adapters.values())
    assert any(p.grad.any() for name, p in adapters.items() if "lora_A" in name)


@pytest.mark.parametrize(
    ("values", "group_size"),
    [
        ([0.5, 1.0, -2.0], 4),
        ([2.7, 0.7, 0.1], 16),  # the float mean of 16 equal rewards is off by rounding: std and advantage stay 0
        ([2.7], 16),
    ],
    ids=["exact", "default-group-size", "one-group"],
)
def test_groups_of_equal_rewards_carry_no_signal(values, group_size):
    """An epoch where every group's rewards are equal: every advantage (group and global std) is exactly 0 and
    finite, every group std is 0 and zero_std_fraction is 1; one group with a spread is counted as such."""
    rewards = torch.tensor(values).repeat_interleave(group_size)
    stats = group_statistics(rewards, group_size)
    assert stats.zero_std_fraction == 1.0
    assert torch.equal(stats.std, torch.zeros(len(values)))
    torch.testing.assert_close(stats.mean, torch.tensor(values))
    for advantages in (stats.advantages, stats.advantages_global_std):
        assert torch.isfinite(advantages).all()
        assert torch.equal(advantages, torch.zeros(len(rewards)))

    rewards[0] += 1.0
    stats = group_statistics(rewards, group_size)
    assert stats.zero_std_fraction == pytest.approx(1 - 1 / len(values))
    assert stats.advantages[0] > 0 and (stats.advantages[1:group_size] < 0).all()


@pytest.mark.parametrize("family", ["ddim", "flow"])
def test_build_policy_draws_noise_only_in_the_configured_window(family):
    """``grpo.sde_start`` / ``sde_steps`` pick the stochastic (trained) steps; without ``sde_steps`` every step from
    ``sde_start`` but the last."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        schedule = build_noise_schedule(DiffusionConfig(**FLOW) if family == "flow" else DiffusionConfig())

    def stochastic(**grpo) -> list[int]:
        cfg = TrainConfig()
        cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, sample_steps=10, **grpo))
        policy = build_policy(cfg, schedule, CPU)
        assert policy.num_steps == 10
        return torch.nonzero(policy.stochastic).flatten().tolist()

    assert stochastic(sde_start=2, sde_steps=3) == [2, 3, 4]
    assert stochastic(sde_start=0, sde_steps=None) == list(range(9))
    assert stochastic(sde_start=2, sde_steps=None) == list(range(2, 9))
    assert stochastic(sde_start=8, sde_steps=1) == [8]


def test_each_trajectory_trains_its_own_random_steps_of_the_window():
    """``grpo.steps_per_trajectory=k``: k distinct steps of the window per trajectory, not the same k for all, drawn
    from the generator alone (a resumed run, whose generator is restored, draws the same); null or the whole window
    takes every step in order, drawing nothing."""
    window = torch.tensor([2, 3, 4, 5])
    generator = torch.Generator().manual_seed(0)
    steps = steps_to_train(window, 64, 2, generator)
    assert steps.shape == (64, 2)
    assert all(len(set(row)) == 2 and set(row) <= {2, 3, 4, 5} for row in steps.tolist())
    assert len({tuple(sorted(row)) for row in steps.tolist()}) > 1
    assert torch.equal(steps, steps_to_train(window, 64, 2, torch.Generator().manual_seed(0)))
    assert (torch.bincount(steps.flatten(), minlength=6)[2:] > 16).all()  # each step about 32 times of 128

    state = generator.get_state()
    for k in (None, 4):
        assert steps_to_train(window, 3, k, generator).tolist() == [[2, 3, 4, 5]] * 3
    assert torch.equal(generator.get_state(), state)


@pytest.mark.parametrize("module", ["dit_trainer.grpo.build", "dit_trainer.grpo.trainer"])
def test_grpo_modules_import_first(module):
    """A GRPO module imports when neither it nor the training loop has been imported yet, as in a fresh
    interpreter. (Here the loop's modules are dropped from ``sys.modules`` and put back afterwards; the privacy
    module stays, its import registers Opacus grad samplers.)"""
    import dit_trainer
    import dit_trainer.grpo
    import dit_trainer.training  # noqa: F401  the state to put back

    def loop() -> list[str]:
        return [
            name
            for name in sys.modules
            if name.startswith(("dit_trainer.training", "dit_trainer.grpo.")) and name != "dit_trainer.training.privacy"
        ]

    saved = {name: sys.modules.pop(name) for name in loop()}
    training, grpo_attributes = dit_trainer.training, dict(vars(dit_trainer.grpo))
    try:
        importlib.import_module(module)
    finally:
        for name in loop():
            del sys.modules[name]
        sys.modules.update(saved)
        dit_trainer.training = training
        vars(dit_trainer.grpo).clear()
        vars(dit_trainer.grpo).update(grpo_attributes)
