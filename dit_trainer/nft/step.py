"""The DiffusionNFT step in the training loop (a ``training.step.TrainingStep``): each step is one epoch of rollouts
by the old policy, rewards, optimality probabilities and updates of the NFT loss, each update through the
``UpdateSequence`` every method shares. Everything else (checkpoints, exact resume, monitors, metrics, preemption)
is the ``Trainer``'s.

An epoch on each process: draw ``prompts_per_epoch`` prompts, roll out ``group_size`` images each with the old
weights and the deterministic sampler (only the final latents are kept), score them, turn each image's group
advantage into r in [0, 1], then ``passes`` x ``minibatches`` optimizer updates, each on fresh noise at
``steps_per_sample`` of the sampler's timesteps per image; after the epoch the old policy moves towards the trained
weights. Every random draw comes from the state's generator, so a resumed run draws what the uninterrupted one did.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from dit_trainer.diffusion.sampler import SamplerSettings, generate
from dit_trainer.diffusion.schedule import NoiseSchedule
from dit_trainer.nft.loss import nft_loss, optimality
from dit_trainer.nft.old_policy import OldPolicy
from dit_trainer.online.feedback import GroupFeedback
from dit_trainer.online.reference import ReferencePolicy
from dit_trainer.training.preflight import PREFLIGHT_ROWS, preflight
from dit_trainer.training.state.saved_state import SavedState
from dit_trainer.training.step import StepParts

SEED_RANGE = 2**31 - 1


@dataclass(frozen=True)
class NFTSettings:
    """What an epoch does (``NFTConfig`` with the defaults resolved)."""

    prompts: list[str]
    group_size: int
    sampling: SamplerSettings  # the rollouts' deterministic sampler, steps and guidance
    rollout_batch_size: int
    adv_clip_max: float
    beta: float
    steps_per_sample: int
    kl_weight: float
    minibatches: int
    passes: int


class NFTStep:
    """A DiffusionNFT epoch as the training loop's step. ``old_policy`` rolls out and anchors the implicit policies;
    ``reference`` (the starting weights) is needed only with ``kl_weight`` > 0."""

    def __init__(
        self,
        parts: StepParts,
        *,
        settings: NFTSettings,
        schedule: NoiseSchedule,
        text_encoder: nn.Module,
        feedback: GroupFeedback,
        old_policy: OldPolicy,
        latent_shape: tuple[int, int, int],
        reference: ReferencePolicy | None = None,
    ) -> None:
        self.accelerator, self.dit, self.state, self.updates = parts.accelerator, parts.dit, parts.state, parts.updates
        self.settings = settings
        self.schedule = schedule
        self.text_encoder = text_encoder
        self.feedback = feedback
        self.old_policy = old_policy
        self.latent_shape = latent_shape
        self.reference = reference
        # The timesteps trained: the rollout sampler's, all but the last (the least noisy).
        sampler = schedule.sampler(settings.sampling.steps, self.accelerator.device, settings.sampling.sampler)
        self.timesteps = sampler.timesteps[:-1].to(self.accelerator.device)
        self.epoch_metrics: dict[str, float] = {}
        self._preflight_done = False
        self.dit.eval()  # no dropout: the old policy and the trained one differ only by their weights

    def batches(self) -> Iterator[list[int]]:
        """Each epoch's prompt indices for this process, from the prompt sampler and the checkpointed generator."""
        while True:
            yield self.feedback.prompt_sampler.draw(self.state.generator)

    def __call__(self, batches: Iterator[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One epoch: roll out, score, optimality, updates, old-policy update. Returns (mean loss, gradient norm)."""
        start = time.perf_counter()
        prompt_indices = next(batches)
        prompts = [self.settings.prompts[i] for i in prompt_indices for _ in range(self.settings.group_size)]
        x0 = self._roll_out(prompts)
        rewards, reward_metrics = self.feedback.score(x0, prompts)
        advantages = self.feedback.advantages(rewards, prompt_indices)
        r = optimality(advantages.values, self.settings.adv_clip_max)
        rollout_seconds = time.perf_counter() - start
        loss, grad_norm, update_metrics = self._update(x0, prompts, r)
        updates = (self.state.step + 1) * self.settings.passes * self.settings.minibatches
        self.epoch_metrics = {
            **reward_metrics,
            "rollout/zero_std_frac": advantages.zero_std_fraction,
            "nft/optimality_mean": self.accelerator.reduce(r.mean(), reduction="mean").item(),
            **update_metrics,
            "nft/old_decay": self.old_policy.update(updates),
            "rollout/seconds": rollout_seconds,
            "policy/seconds": time.perf_counter() - start - rollout_seconds,
        }
        return loss, grad_norm

    @torch.no_grad()
    def _roll_out(self, prompts: list[str]) -> torch.Tensor:
        """(N, C, H, W) final latents of ``prompts`` from the old policy, each from a seed the generator draws."""
        generator = self.state.generator
        seeds = torch.randint(0, SEED_RANGE, (len(prompts),), generator=generator, device=generator.device).tolist()
        model, size = self.accelerator.unwrap_model(self.dit), self.settings.rollout_batch_size
        with self.old_policy.swapped_in():
            return torch.cat([
                generate(model, self.schedule, self.text_encoder, prompts[i : i + size], seeds[i : i + size],
                         self.latent_shape, self.settings.sampling, self.accelerator.device)
                for i in range(0, len(prompts), size)
            ])  # fmt: skip

    def _update(
        self, x0: torch.Tensor, prompts: list[str], r: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """``passes`` x ``minibatches`` optimizer updates over this epoch's images."""
        generator, count = self.state.generator, len(prompts)
        condition = self.text_encoder.encode(prompts)
        losses, grad_norm = [], torch.zeros(())
        for _ in range(self.settings.passes):
            order = torch.randperm(count, generator=generator, device=generator.device).to(x0.device)
            for images in torch.tensor_split(order, self.settings.minibatches):
                k = self.settings.steps_per_sample
                draws = torch.rand(len(images), len(self.timesteps), generator=generator, device=generator.device)
                steps = draws.argsort(dim=1)[:, :k].flatten().to(x0.device)
                rows = images.repeat_interleave(k)
                noise = torch.randn(x0[rows].shape, generator=generator, device=generator.device).to(x0.device)
                loss, grad_norm = self._optimizer_update(x0[rows], condition.rows(rows), steps, noise, r[rows])
                losses.append(loss)
        mean_loss = torch.stack(losses).mean()
        return mean_loss, grad_norm, {"policy/updates": len(losses), "policy/loss": mean_loss.item()}

    def _optimizer_update(self, x0, condition, steps, noise, r) -> tuple[torch.Tensor, torch.Tensor]:
        """One update on rows of (clean latents, condition, timestep index, fresh noise, optimality)."""
        timesteps, model = self.timesteps[steps], self.accelerator.unwrap_model(self.dit)
        x_t = self.schedule.add_noise(x0, noise, timesteps)
        with self.old_policy.swapped_in():  # before the trained forward: its graph must see the trained weights
            x0_old = self.schedule.predicted_x0(model(x_t, timesteps, condition).float(), x_t, timesteps)
        reference = self.reference(x_t, timesteps, condition).float() if self.settings.kl_weight > 0 else None
        inputs = (x0, x0_old, x_t, timesteps, condition, r, reference)
        if not self._preflight_done:
            few = slice(PREFLIGHT_ROWS)
            first = (x0[few], x0_old[few], x_t[few], timesteps[few], condition.rows(few), r[few],
                     None if reference is None else reference[few])  # fmt: skip
            preflight(model, lambda: self._loss(model, *first).mean())
            self._preflight_done = True

        def backward() -> torch.Tensor:
            return self.updates.update.backward(self._loss(self.dit, *inputs))

        return self.updates.apply([backward])

    def _loss(self, dit, x0, x0_old, x_t, timesteps, condition, r, reference) -> torch.Tensor:
        """(R,) NFT loss of ``dit``'s predictions (+ ``kl_weight`` x their squared distance to the reference's)."""
        prediction = dit(x_t, timesteps, condition).float()
        loss = nft_loss(x0, x0_old, self.schedule.predicted_x0(prediction, x_t, timesteps), r, self.settings.beta)
        if reference is not None:
            loss = loss + self.settings.kl_weight * (prediction - reference).square().mean(dim=(1, 2, 3))
        return loss

    def metrics(self) -> dict[str, float]:
        """The last epoch's rollout, reward and update statistics (each already over every process)."""
        return self.epoch_metrics

    def saved_states(self) -> dict[str, SavedState]:
        """The prompt sampler's statistics, and the old policy's weights (which the rollouts after a resume need)."""
        return {"nft_prompts": self.feedback.prompt_sampler, "nft_old_policy": self.old_policy}
