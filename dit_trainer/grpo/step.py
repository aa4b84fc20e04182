"""The GRPO step in the training loop (a ``training.step.TrainingStep``): each step is one epoch of rollouts,
rewards, group advantages and policy updates, each update through the ``UpdateSequence`` every method shares.
Everything else (checkpoints, exact resume, monitors, metrics, preemption) is the ``Trainer``'s.

An epoch on each process: draw ``prompts_per_epoch`` prompts, place the window of noisy steps (``grpo.sde_window``),
roll out ``group_size`` trajectories each with the raw weights (``roll_out``; with ``shared_prefix`` the steps
before the window once per prompt, with ``tail_steps`` those after it in fewer, coarser steps), decode and score
the final latents, turn rewards into advantages within each prompt's group (statistics gathered over processes),
then ``passes`` x ``minibatches`` optimizer updates of the clipped policy loss over the trained steps of the kept
trajectories (every step of the noisy window, or a random ``steps_per_trajectory`` of them per trajectory). The
model stays in eval mode throughout (no dropout): the policy that rolls out is exactly the one that is updated, so
the first update's ratio is 1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from dit_trainer.diffusion.policy import StochasticPolicy
from dit_trainer.grpo.loss import clipped_policy_loss, gaussian_kl, ratio_statistics
from dit_trainer.grpo.rollout import Rollout, recompute_steps, roll_out
from dit_trainer.grpo.window import SDEWindow
from dit_trainer.online.feedback import GroupFeedback
from dit_trainer.online.reference import ReferencePolicy
from dit_trainer.training.preflight import PREFLIGHT_ROWS, preflight
from dit_trainer.training.state.saved_state import SavedState
from dit_trainer.training.step import StepParts


@dataclass(frozen=True)
class GRPOSettings:
    """What an epoch does (``GRPOConfig`` with the defaults resolved)."""

    prompts: list[str]
    prompts_per_epoch: int
    group_size: int
    guidance_scale: float
    clip_range: float
    filter_zero_std: bool
    beta: float
    minibatches: int
    passes: int
    rollout_batch_size: int
    train_unconditional: bool = True
    steps_per_trajectory: int | None = None
    shared_prefix: bool = False
    tail_steps: int | None = None


def steps_to_train(window: torch.Tensor, count: int, k: int | None, generator: torch.Generator) -> torch.Tensor:
    """(count, k) CPU: the steps each of ``count`` trajectories trains this epoch: the whole ``window``, or ``k`` of
    its steps drawn per trajectory from ``generator`` (the run's checkpointed one, so a resumed run draws the same)."""
    window = window.cpu()
    if k is None or k == len(window):
        return window.expand(count, -1)
    draws = torch.rand(count, len(window), generator=generator, device=generator.device)
    return window[draws.argsort(dim=1)[:, :k].cpu()]


class GRPOStep:
    """A GRPO epoch as the training loop's step. ``policy`` is the stochastic sampler (its ``stochastic`` steps are
    the trained ones), which ``window`` places each epoch; ``reference`` is needed only with ``beta`` > 0; every
    random draw comes from ``state``'s generator, so a resumed run draws what the uninterrupted one did."""

    def __init__(
        self,
        parts: StepParts,
        *,
        grpo: GRPOSettings,
        policy: StochasticPolicy,
        text_encoder: nn.Module,
        feedback: GroupFeedback,
        latent_shape: tuple[int, int, int],
        window: SDEWindow,
        reference: ReferencePolicy | None = None,
    ) -> None:
        self.accelerator, self.dit, self.state, self.updates = parts.accelerator, parts.dit, parts.state, parts.updates
        self.grpo = grpo
        self.feedback = feedback
        self.prompt_sampler = feedback.prompt_sampler  # checkpointed with the run (``saved_states``)
        self.policy = policy
        self.window = window
        self.trained_steps = torch.nonzero(policy.stochastic).flatten()
        self.text_encoder = text_encoder
        self.latent_shape = latent_shape
        self.reference = reference
        self.epoch_metrics: dict[str, float] = {}
        self._preflight_done = False
        self.dit.eval()  # no dropout: the policy that rolls out is the one updated

    def batches(self) -> Iterator[list[int]]:
        """Each epoch's prompt indices for this process, from the prompt sampler and the checkpointed generator,
        so a resumed run draws the same."""
        while True:
            yield self.prompt_sampler.draw(self.state.generator)

    def __call__(self, batches: Iterator[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One epoch: roll out, score, advantages, updates. Returns (mean policy loss, last gradient norm)."""
        start = time.perf_counter()
        prompt_indices = next(batches)
        self._place_window()
        rollout = roll_out(
            self.dit,
            self.policy,
            self.text_encoder,
            [self.grpo.prompts[i] for i in prompt_indices],
            self.grpo.group_size,
            self.latent_shape,
            self.grpo.guidance_scale,
            self.state.generator,
            self.grpo.rollout_batch_size,
            prefix_steps=self.window.start if self.grpo.shared_prefix else None,
            tail_steps=self.grpo.tail_steps,
        )
        rewards, reward_metrics = self.feedback.score(rollout.final_latents, rollout.image_prompts)
        advantages = self.feedback.advantages(rewards, prompt_indices)
        rollout_seconds = time.perf_counter() - start
        loss, grad_norm, update_metrics = self._update(rollout, advantages.values, advantages.zero_std)
        self.epoch_metrics = {
            **reward_metrics,
            "rollout/zero_std_frac": advantages.zero_std_fraction,
            **update_metrics,
            "rollout/seconds": rollout_seconds,
            "policy/seconds": time.perf_counter() - start - rollout_seconds,
        }
        if self.window.moves:
            self.epoch_metrics["rollout/window_start"] = self.window.start
        return loss, grad_norm

    def _place_window(self) -> None:
        """This epoch's noisy, trained steps: the policy draws noise there, and the updates train them."""
        self.policy.set_window(self.window.place(self.state.generator))
        self.trained_steps = torch.nonzero(self.policy.stochastic).flatten()

    def _kept(self, zero_std: torch.Tensor) -> torch.Tensor:
        """The trajectories to train on: those of groups with a reward spread (all, without ``filter_zero_std``),
        topped up with zero-advantage ones to one per minibatch, so that every process takes part in every update
        (DDP's gradient all-reduce) even when its groups carry no signal."""
        if not self.grpo.filter_zero_std:
            return torch.arange(len(zero_std))
        kept = torch.nonzero(~zero_std.cpu()).flatten()
        shortfall = self.grpo.minibatches - len(kept)
        if shortfall > 0:
            kept = torch.cat([kept, torch.nonzero(zero_std.cpu()).flatten()[:shortfall]])
        return kept

    def _update(
        self, rollout: Rollout, advantages: torch.Tensor, zero_std: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """``passes`` x ``minibatches`` optimizer updates; none when no process has a group with a reward spread
        (every advantage is 0: an update would only move Adam's state)."""
        signal = torch.tensor(float((~zero_std).sum()), device=self.accelerator.device)
        if self.accelerator.reduce(signal, reduction="sum").item() == 0:
            zero = torch.zeros((), device=self.accelerator.device)
            return zero, zero, {"policy/updates": 0}
        generator = self.state.generator
        kept = self._kept(zero_std)
        steps = steps_to_train(self.trained_steps, len(zero_std), self.grpo.steps_per_trajectory, generator)
        losses, statistics, grad_norm = [], [], torch.zeros(())
        for _ in range(self.grpo.passes):
            order = kept[torch.randperm(len(kept), generator=generator, device=generator.device).cpu()]
            for trajectories in torch.tensor_split(order, self.grpo.minibatches):
                loss, grad_norm, stats = self._optimizer_update(rollout, advantages, trajectories, steps[trajectories])
                losses.append(loss)
                statistics.append(stats)
        metrics = {"policy/updates": len(losses), "policy/trained_trajectories": len(kept)}
        return torch.stack(losses).mean(), grad_norm, metrics | self._summarise(statistics)

    def _summarise(self, statistics: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        """The epoch's update statistics: means over updates and processes; the ratio's extremes over updates."""
        summary = {}
        for key in statistics[0]:
            values = torch.stack([stats[key] for stats in statistics])
            if key.endswith("_min"):
                summary[key] = values.min().item()
            elif key.endswith("_max"):
                summary[key] = values.max().item()
            else:
                summary[key] = self.accelerator.reduce(values.mean(), reduction="mean").item()
        return summary

    def _optimizer_update(
        self, rollout: Rollout, advantages: torch.Tensor, trajectories: torch.Tensor, trajectory_steps: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """One update on ``trajectory_steps[i]`` (CPU) of each of ``trajectories``, all in one forward and backward."""
        rows = trajectories.repeat_interleave(trajectory_steps.shape[1]).to(rollout.samples.device)
        steps = trajectory_steps.flatten().to(rollout.samples.device)
        if not self._preflight_done:
            model = self.accelerator.unwrap_model(self.dit)
            few = slice(PREFLIGHT_ROWS)
            preflight(model, lambda: self.policy_loss(model, rollout, advantages, rows[few], steps[few])[0].mean())
            self._preflight_done = True
        stats: dict[str, torch.Tensor] = {}

        def backward() -> torch.Tensor:
            per_row, update_stats = self.policy_loss(self.dit, rollout, advantages, rows, steps)
            stats.update(update_stats)
            return self.updates.update.backward(per_row)

        loss, grad_norm = self.updates.apply([backward])
        return loss, grad_norm, stats

    def policy_loss(
        self, dit: nn.Module, rollout: Rollout, advantages: torch.Tensor, rows: torch.Tensor, steps: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(R,) clipped policy loss (+ beta x KL to the reference) of step ``steps[r]`` of trajectory ``rows[r]``,
        recomputed with ``dit``; and the ratio statistics."""
        guidance = self.grpo.guidance_scale
        log_prob, mean, std = recompute_steps(
            dit, self.policy, rollout, rows, steps, guidance, not self.grpo.train_unconditional
        )
        old_log_prob = rollout.log_probs[rows, steps]
        loss = clipped_policy_loss(log_prob, old_log_prob, advantages[rows], self.grpo.clip_range)
        ratios = ratio_statistics(log_prob, old_log_prob, self.grpo.clip_range)
        stats = {f"policy/{key}": value for key, value in ratios.items()}
        if self.grpo.beta > 0:
            reference_mean = recompute_steps(self.reference, self.policy, rollout, rows, steps, guidance)[1]
            kl = gaussian_kl(mean, reference_mean, std)
            loss = loss + self.grpo.beta * kl
            stats["policy/kl"] = kl.detach().mean()
        stats["policy/loss"] = loss.detach().mean()
        return loss, stats

    def metrics(self) -> dict[str, float]:
        """The last epoch's rollout, reward and update statistics (each already over every process)."""
        return self.epoch_metrics

    def saved_states(self) -> dict[str, SavedState]:
        """The prompt sampler's per-prompt reward statistics (``grpo.prompt_sampling=spread`` draws by them), and a
        moving window's epoch count and position (a fixed one has none: its checkpoints stay as they were)."""
        states: dict[str, SavedState] = {"grpo_prompts": self.prompt_sampler}
        if self.window.moves:
            states["grpo_window"] = self.window
        return states
