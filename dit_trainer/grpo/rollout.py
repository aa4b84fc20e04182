"""Rollouts: prompts x G images from the stochastic policy with the current weights, with the trajectory GRPO's
update needs (every latent up to the window's end, the log-probability of every step taken) and the prompts' text
condition."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dit_trainer.condition import Condition
from dit_trainer.diffusion.policy import StochasticPolicy, gaussian_log_prob
from dit_trainer.diffusion.sampler import guided_prediction


@dataclass
class Rollout:
    """``len(prompts) x group_size`` trajectories, prompt-major (trajectory ``i`` belongs to prompt ``i // G``).
    ``samples`` holds the latents of the first S steps: all K of the sampler's, or those up to the window's end when
    a coarser sampler finished the images (``tail_steps``)."""

    prompts: list[str]
    group_size: int
    samples: torch.Tensor  # (N, S + 1, C, H, W) float32: the noise, then the latent after each of the S steps
    log_probs: torch.Tensor  # (N, S) float32 log-probability of each step taken (0 where a step was deterministic)
    final_latents: torch.Tensor  # (N, C, H, W) float32: the finished images' latents, what the reward reads
    prompt_condition: Condition  # (P, ...) the prompts' condition
    null_condition: Condition  # (1, ...) the empty prompt's, for CFG

    @property
    def image_prompts(self) -> list[str]:
        return [prompt for prompt in self.prompts for _ in range(self.group_size)]

    def condition(self, rows: torch.Tensor, guidance_scale: float) -> Condition:
        """The condition of trajectories ``rows``, in ``guided_prediction``'s layout (empty-prompt rows appended
        when CFG is on)."""
        prompt_rows = rows.to(self.prompt_condition.sequence.device) // self.group_size
        condition = self.prompt_condition.rows(prompt_rows)
        if guidance_scale == 1.0:
            return condition
        return Condition.cat([condition, self.null_condition.expand(len(prompt_rows))])


@dataclass(frozen=True)
class _Denoiser:
    """What every batch of a rollout is sampled with: the weights, the policy, CFG and the generator."""

    dit: nn.Module
    policy: StochasticPolicy
    rollout: Rollout  # the trajectories' condition
    guidance_scale: float
    generator: torch.Generator
    batch_size: int

    def _batches(self, rows: torch.Tensor) -> Iterator[tuple[torch.Tensor, Condition]]:
        """Positions in ``rows`` of each batch of ``batch_size`` trajectories, with the batch's condition."""
        for batch in torch.arange(len(rows), device=rows.device).split(self.batch_size):
            yield batch, self.rollout.condition(rows[batch], self.guidance_scale)

    def _predict(self, x: torch.Tensor, index: int, condition: Condition) -> torch.Tensor:
        """The (guided) prediction at grid point ``index``."""
        t = self.policy.timesteps[index].reshape(1)
        return guided_prediction(self.dit, x, t, condition, self.guidance_scale)

    def __call__(self, latents: torch.Tensor, rows: torch.Tensor, steps: range) -> tuple[torch.Tensor, torch.Tensor]:
        """``latents`` of trajectories ``rows`` through ``steps``, ``batch_size`` at a time: the trajectory
        (B, len(steps) + 1, C, H, W), from ``latents`` on, and the (B, len(steps)) log-probs (0 where a step was
        deterministic)."""
        samples, log_probs = [], []
        for batch, condition in self._batches(rows):
            x, trajectory, step_log_probs = latents[batch], [latents[batch]], []
            for index in steps:
                x, log_prob = self.policy.step(x, self._predict(x, index, condition), index, self.generator)
                trajectory.append(x)
                step_log_probs.append(torch.zeros(len(batch), device=rows.device) if log_prob is None else log_prob)
            samples.append(torch.stack(trajectory, dim=1))
            log_probs.append(torch.stack(step_log_probs, dim=1))
        return torch.cat(samples), torch.cat(log_probs)

    def finish(self, latents: torch.Tensor, rows: torch.Tensor, grid: list[int]) -> torch.Tensor:
        """``latents`` of trajectories ``rows`` at grid point ``grid[0]`` to the end, in deterministic steps
        between the grid points ``grid`` (the policy's ``jump``), ``batch_size`` at a time: the final latents."""
        finished = []
        for batch, condition in self._batches(rows):
            x = latents[batch]
            for index, target in zip(grid[:-1], grid[1:]):
                x = self.policy.jump(x, self._predict(x, index, condition), index, target)
            finished.append(x)
        return torch.cat(finished)


def tail_grid(start: int, num_steps: int, tail_steps: int | None) -> list[int]:
    """The grid points that finish a trajectory from grid point ``start``: every one to ``num_steps`` (the
    sampler's own steps), or ``tail_steps`` steps between points spread evenly over that stretch (MixGRPO-Flash's
    compressed tail, with the sampler's own first-order step)."""
    remaining = num_steps - start
    if tail_steps is None or tail_steps >= remaining:
        return list(range(start, num_steps + 1))
    return torch.linspace(start, num_steps, tail_steps + 1).round().long().tolist()


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
    prefix_steps: int | None = None,
    tail_steps: int | None = None,
) -> Rollout:
    """Sample ``group_size`` trajectories per prompt with ``policy`` (all randomness from ``generator``),
    ``batch_size`` trajectories at a time, each from its own noise; or, with ``prefix_steps`` (Flow-GRPO-Fast's
    shared prefix), each group from one noise and through its first ``prefix_steps`` steps (deterministic ones) once:
    a group branches where its window starts, and its latents before that are the same. With ``tail_steps``, the
    deterministic steps after the window are replaced by that many coarser ones (``tail_grid``): nothing after the
    window is trained, only its final image is scored."""
    shared = prefix_steps or 0
    assert not any(policy.stochastic_steps[:shared]), "a shared prefix has no noise to draw"
    stop = policy.num_steps if tail_steps is None else policy.window_end
    prompt_condition, null_condition = text_encoder.encode(list(prompts)), text_encoder.encode([""])
    count, device = len(prompts) * group_size, generator.device
    empty = torch.empty(0)
    rollout = Rollout(list(prompts), group_size, empty, empty, empty, prompt_condition, null_condition)
    denoise = _Denoiser(dit, policy, rollout, guidance_scale, generator, batch_size)
    if prefix_steps is None:
        head = torch.randn((count, *latent_shape), generator=generator, device=device)[:, None]
    else:
        firsts = torch.arange(len(prompts), device=device) * group_size  # each group's first trajectory
        noise = torch.randn((len(prompts), *latent_shape), generator=generator, device=device)
        head = noise[:, None] if shared == 0 else denoise(noise, firsts, range(shared))[0]
        head = head.repeat_interleave(group_size, dim=0)
    rows = torch.arange(count, device=device)
    samples, log_probs = denoise(head[:, -1], rows, range(shared, stop))
    rollout.samples = torch.cat([head[:, :-1], samples], dim=1)
    rollout.log_probs = torch.cat([torch.zeros(count, shared, device=device), log_probs], dim=1)
    grid = tail_grid(stop, policy.num_steps, tail_steps)
    rollout.final_latents = samples[:, -1] if len(grid) == 1 else denoise.finish(samples[:, -1], rows, grid)
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
