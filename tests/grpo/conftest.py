"""Rollouts of the tiny shapes model for the GRPO tests: the stochastic sampler, prompts x G trajectories, and the
trained steps of a trajectory."""

import warnings

import pytest
import torch

from dit_trainer.config import DiffusionConfig
from dit_trainer.diffusion.build import build_noise_schedule
from dit_trainer.grpo.rollout import Rollout, roll_out

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


def rollout_policy(schedule, noise_level=None):
    """The rollout sampler: every step stochastic but the last."""
    stochastic = torch.ones(STEPS, dtype=torch.bool)
    stochastic[-1] = False
    return schedule.policy(STEPS, CPU, noise_level, stochastic)


def schedule_of(family: str, parts):
    if family == "ddim":
        return parts.schedule  # v-prediction DDPM
    with warnings.catch_warnings():  # the fallback's warning is not what these tests check
        warnings.simplefilter("ignore", UserWarning)
        return build_noise_schedule(DiffusionConfig(**FLOW))


def tiny_roll_out(
    parts, policy, prompts=PROMPTS, group_size=GROUP, seed=0, prefix_steps=None, tail_steps=None
) -> Rollout:
    """prompts x G trajectories, 5 at a time (batches split unevenly, across groups), from the dit in eval mode;
    the first ``prefix_steps`` once per prompt, the steps after the window in ``tail_steps``."""
    parts.dit.eval()
    generator = torch.Generator().manual_seed(seed)
    text_encoder, shape = parts.text_encoder, parts.latent_shape
    return roll_out(
        parts.dit, policy, text_encoder, prompts, group_size, shape, GUIDANCE, generator, 5, prefix_steps, tail_steps
    )


def trained_rows(policy, trajectories: torch.Tensor, shuffle: int | None = None):
    """(rows, steps): every trained (stochastic) step of ``trajectories``, optionally shuffled."""
    trained = torch.nonzero(policy.stochastic).flatten()
    rows = trajectories.repeat_interleave(len(trained))
    steps = trained.repeat(len(trajectories))
    if shuffle is not None:
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(shuffle))
        rows, steps = rows[order], steps[order]
    return rows, steps
