"""A compressed tail (``roll_out(tail_steps=...)``, MixGRPO-Flash's): after the window the images are finished in
fewer deterministic steps. The window and everything before it are rolled out as without the tail (same noise, same
latents, same log-probs), the trajectory is kept only up to the window's end, and the final latents are the coarser
sampler's."""

import pytest
import torch

from dit_trainer.diffusion.sampler import guided_prediction
from dit_trainer.grpo.rollout import recompute_steps, tail_grid

from .conftest import GUIDANCE, STEPS, schedule_of, tiny_roll_out, trained_rows
from .test_shared_prefix import windowed_policy


@pytest.mark.parametrize(
    ("start", "num_steps", "tail_steps", "grid"),
    [(3, 10, None, [3, 4, 5, 6, 7, 8, 9, 10]), (3, 10, 2, [3, 6, 10]), (2, 10, 3, [2, 5, 7, 10]),
     (7, 10, 3, [7, 8, 9, 10]), (7, 10, 5, [7, 8, 9, 10]), (10, 10, 2, [10])],
)  # fmt: skip
def test_the_tail_grid_spreads_its_steps_over_what_remains(start, num_steps, tail_steps, grid):
    assert tail_grid(start, num_steps, tail_steps) == grid


@pytest.mark.parametrize("family", ["ddim", "flow"])
def test_a_compressed_tail_keeps_the_window_and_finishes_coarser(tiny_parts, family):
    """Window at steps 1-2 of 6: with ``tail_steps=1`` the latents up to step 3 and every log-prob are those of the
    full rollout, the final latent is one jump from step 3 to the end, and the window's log-probs still recompute
    to the rollout's (the first update's ratio is one)."""
    policy = windowed_policy(schedule_of(family, tiny_parts), start=1)
    full = tiny_roll_out(tiny_parts, policy)
    short = tiny_roll_out(tiny_parts, policy, tail_steps=1)
    end = policy.window_end
    assert end == 3 and short.samples.shape[1] == end + 1 and short.log_probs.shape[1] == end
    assert torch.equal(short.samples, full.samples[:, : end + 1])
    assert torch.equal(short.log_probs, full.log_probs[:, :end])
    assert torch.equal(full.final_latents, full.samples[:, -1])

    rows = torch.arange(len(short.final_latents))
    with torch.no_grad():
        last = short.samples[:, end]
        t = policy.timesteps[end].reshape(1)
        prediction = guided_prediction(tiny_parts.dit, last, t, short.condition(rows, GUIDANCE), GUIDANCE)
        torch.testing.assert_close(short.final_latents, policy.jump(last, prediction, end, STEPS))
        rows, steps = trained_rows(policy, rows)
        log_prob = recompute_steps(tiny_parts.dit, policy, short, rows, steps, GUIDANCE)[0]
    assert (log_prob - short.log_probs[rows, steps]).abs().max() <= 1e-5
    assert not torch.allclose(short.final_latents, full.final_latents, atol=1e-3)


def test_a_tail_as_long_as_the_sampler_s_finishes_as_the_sampler_does(tiny_parts):
    policy = windowed_policy(tiny_parts.schedule, start=1)
    full, long_tail = tiny_roll_out(tiny_parts, policy), tiny_roll_out(tiny_parts, policy, tail_steps=STEPS)
    assert long_tail.samples.shape[1] == policy.window_end + 1
    torch.testing.assert_close(long_tail.final_latents, full.final_latents, rtol=1e-5, atol=1e-5)
