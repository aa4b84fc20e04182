"""Rollouts: prompts x G images from the stochastic policy with the current weights, with the trajectory GRPO's
update needs (every latent, the log-probability of every step taken) and the prompts' text condition."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dit_trainer.condition import Condition
from dit_trainer.diffusion.policy import StochasticPolicy, gaussian_log_prob
from dit_trainer.diffusion.sampler import guided_prediction


@dataclass
class Rollout:
    """``len(prompts) x group_size`` trajectories, prompt-major (trajectory ``i`` belongs to prompt ``i // G``)."""

    prompts: list[str]
    group_size: int
    samples: torch.Tensor  # (N, K + 1, C, H, W) float32: the noise, then the latent after each of the K steps
    log_probs: torch.Tensor  # (N, K) float32 log-probability of each step taken (0 where a step was deterministic)
    prompt_condition: Condition  # (P, ...) the prompts' condition
    null_condition: Condition  # (1, ...) the empty prompt's, for CFG

    @property
    def image_prompts(self) -> list[str]:
        return [prompt for prompt in self.prompts for _ in range(self.group_size)]

    @property
    def final_latents(self) -> torch.Tensor:
        return self.samples[:, -1]

    def condition(self, rows: torch.Tensor, guidance_scale: float) -> Condition:
        """The condition of trajectories ``rows``, in ``guided_prediction``'s layout (empty-prompt rows appended
        when CFG is on)."""
        prompt_rows = rows.to(self.prompt_condition.sequence.device) // self.group_size
        condition = self.prompt_condition.rows(prompt_rows)
        if guidance_scale == 1.0:
            return condition
        return Condition.cat([condition, self.null_condition.expand(len(prompt_rows))])


@torch.no_grad()
def roll_out(
    dit: nn.Module,
    policy: StochasticPolicy,
    text_encoder,
    prompts: Sequence[str],
    group_size: int,
    latent_shape: tuple[int, int, int],
    guidance_scale: float,
    generator: torch.Generator,
    batch_size: int,
) -> Rollout:
    """Sample ``group_size`` trajectories per prompt with ``policy`` (all randomness from ``generator``),
    ``batch_size`` trajectories at a time."""
    prompt_condition, null_condition = text_encoder.encode(list(prompts)), text_encoder.encode([""])
    count = len(prompts) * group_size
    device = generator.device
    noise = torch.randn((count, *latent_shape), generator=generator, device=device)
    rollout = Rollout(list(prompts), group_size, noise, noise, prompt_condition, null_condition)
    samples, log_probs = [], []
    for rows in torch.arange(count, device=device).split(batch_size):
        condition = rollout.condition(rows, guidance_scale)
        latents, trajectory, step_log_probs = noise[rows], [noise[rows]], []
        for index, t in enumerate(policy.timesteps):
            prediction = guided_prediction(dit, latents, t.reshape(1), condition, guidance_scale)
            latents, log_prob = policy.step(latents, prediction, index, generator)
            trajectory.append(latents)
            step_log_probs.append(torch.zeros(len(rows), device=device) if log_prob is None else log_prob)
        samples.append(torch.stack(trajectory, dim=1))
        log_probs.append(torch.stack(step_log_probs, dim=1))
    rollout.samples, rollout.log_probs = torch.cat(samples), torch.cat(log_probs)
    return rollout


def recompute_steps(
    dit: nn.Module,
    policy: StochasticPolicy,
    rollout: Rollout,
    rows: torch.Tensor,
    steps: torch.Tensor,
    guidance_scale: float,
    detach_unconditional: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log_prob (R,), mean, std) of step ``steps[r]`` of trajectory ``rows[r]`` under ``dit``, all rows in one
    forward (the training layout: rows of many trajectories and steps together). With the weights that rolled out,
    the log-probs equal the rollout's."""
    sample, next_sample = rollout.samples[rows, steps], rollout.samples[rows, steps + 1]
    condition = rollout.condition(rows, guidance_scale)
    prediction = guided_prediction(
        dit, sample, policy.timesteps[steps], condition, guidance_scale, detach_unconditional
    )
    mean, std = policy.distribution(sample, prediction, steps)
    return gaussian_log_prob(next_sample, mean, std), mean, std
