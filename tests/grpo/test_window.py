"""Where the window of noisy, trained steps sits each epoch (``grpo/window.py``) and what the checks refuse of it
(``grpo/checks.py``, with the noise a step may add): fixed stays today's window and draws nothing; random draws its
start from the run's generator; sliding moves one step every N epochs and wraps; a moving window's state resumes it
exactly."""

import dataclasses

import pytest
import torch

from dit_trainer.config import TrainConfig, call_with_sections
from dit_trainer.errors import ConfigError
from dit_trainer.grpo.checks import check_grpo
from dit_trainer.grpo.window import SDEWindow, window_plan

from ..conftest import one_paragraph


def config(objective: str = "v_prediction", **grpo) -> TrainConfig:
    """A GRPO config the shared online checks pass: a pretrained model to start from, prompts, 10 sampler steps."""
    cfg = TrainConfig()
    grpo = {"prompts": ["a red circle"], "sample_steps": 10, **grpo}
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, pretrained="a/model"),
        diffusion=dataclasses.replace(cfg.diffusion, objective=objective),
        grpo=dataclasses.replace(cfg.grpo, **grpo),
    )


def starts(window: SDEWindow, epochs: int, generator: torch.Generator) -> list[int]:
    """The window's start in each of the next ``epochs`` epochs, asserting each mask is the window at that start."""
    result = []
    for _ in range(epochs):
        mask = window.place(generator)
        steps = torch.nonzero(mask).flatten().tolist()
        assert steps == list(range(window.start, window.start + window.plan.size))
        result.append(window.start)
    return result


@pytest.mark.parametrize(
    ("grpo", "expected"),
    [({"sde_start": 2, "sde_steps": 3}, [2, 3, 4]), ({}, list(range(9))), ({"sde_start": 3}, list(range(3, 9)))],
)
def test_a_fixed_window_is_todays_window_every_epoch_and_draws_nothing(grpo, expected):
    """The default: the steps ``sde_start`` / ``sde_steps`` picked before this option existed, in every epoch,
    without a draw from the run's generator (so its rollouts and updates are those of before, bit for bit), and no
    state of its own in the checkpoint."""
    window = SDEWindow(window_plan(config(**grpo).grpo))
    assert not window.moves
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    for _ in range(3):
        assert torch.nonzero(window.place(generator)).flatten().tolist() == expected
    assert torch.equal(generator.get_state(), state)


def test_a_random_window_draws_its_start_from_the_generator_within_its_range():
    """Flow-GRPO-Fast's window: 2 steps within the first 5 (starts 0-3), each start about equally often, the same
    sequence from the same generator state; after a restore of the window's state and the generator's (a resume)
    the next starts are those the uninterrupted run drew."""
    plan = window_plan(config(sde_window="random", sde_steps=2).grpo)
    assert (plan.span, plan.positions) == (5, 4)  # window_range null: half of the 10 steps
    generator = torch.Generator().manual_seed(0)
    drawn = starts(SDEWindow(plan), 400, generator)
    assert set(drawn) == {0, 1, 2, 3} and min(drawn.count(s) for s in range(4)) > 70
    assert drawn == starts(SDEWindow(plan), 400, torch.Generator().manual_seed(0))
    assert drawn != starts(SDEWindow(plan), 400, torch.Generator().manual_seed(1))

    straight, generator = SDEWindow(plan), torch.Generator().manual_seed(3)
    first = starts(straight, 5, generator)
    saved, generator_state = straight.state_dict(), generator.get_state()
    assert saved == {"epoch": 5, "start": first[-1]}
    rest = starts(straight, 5, generator)
    resumed, generator = SDEWindow(plan), torch.Generator().manual_seed(99)
    resumed.load_state_dict(saved)
    generator.set_state(generator_state)
    assert resumed.start == first[-1]
    assert starts(resumed, 5, generator) == rest


def test_a_sliding_window_moves_one_step_every_n_epochs_and_wraps():
    """MixGRPO's window: from ``sde_start`` one step later every ``slide_every`` epochs, back to ``sde_start``
    after the range's last position; no draws. Its epoch count is its checkpointed state: a restored window slides
    on from there."""
    plan = window_plan(config(sde_window="sliding", sde_start=1, sde_steps=2, window_range=4, slide_every=2).grpo)
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    window = SDEWindow(plan)
    assert starts(window, 14, generator) == [1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3, 1, 1]
    assert torch.equal(generator.get_state(), state)

    straight, resumed = SDEWindow(plan), SDEWindow(plan)
    starts(straight, 3, generator)
    resumed.load_state_dict(straight.state_dict())
    assert starts(resumed, 6, generator) == starts(straight, 6, generator) == [2, 3, 3, 1, 1, 2]


def test_sliding_by_one_every_epoch_visits_every_start_of_the_default_range():
    plan = window_plan(config(sde_window="sliding", sde_steps=3).grpo)
    assert starts(SDEWindow(plan), 7, torch.Generator()) == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize(
    ("grpo", "key", "says"),
    [
        ({"sde_window": "random", "sde_steps": None}, "grpo.sde_steps", "needs a size"),
        ({"sde_window": "sliding", "sde_steps": 6}, "grpo.sde_steps", "does not fit its range of 5 steps"),
        ({"sde_window": "random", "sde_steps": 3, "window_range": 2}, "grpo.sde_steps", "range of 2 steps"),
        ({"sde_window": "random", "sde_steps": 2, "window_range": 10}, "grpo.window_range", "must lie within"),
        ({"sde_window": "sliding", "sde_steps": 2, "sde_start": 6}, "grpo.window_range", "from `grpo.sde_start=6`"),
        ({"sde_window": "random", "sde_steps": 2, "steps_per_trajectory": 3}, "grpo.steps_per_trajectory", "only 2"),
        ({"sde_type": "cps"}, "grpo.sde_type", "objective is `v_prediction`"),
        ({"sde_window": "fixed", "sde_start": 8, "sde_steps": 2}, "grpo.sde_start/sde_steps", "the last step"),
        ({"window_range": 4}, "grpo.window_range", "`grpo.sde_window=fixed` keeps the window"),  # ignored otherwise
        ({"slide_every": 3}, "grpo.slide_every", "`grpo.sde_window=sliding`"),
    ],
)
def test_a_window_or_step_the_sampler_cannot_take_is_refused_in_one_paragraph(grpo, key, says):
    """A moving window without a size, larger than its range, or a range past the sampler's last noisy step; more
    trained steps per trajectory than the window has; the coefficients-preserving step on a model that is not
    flow matching (its step is DDIM-eta, which has no CPS form); a moving window's setting on a fixed window."""
    with pytest.raises(ConfigError) as caught:
        call_with_sections(check_grpo, config(**grpo))
    assert says in one_paragraph(caught.value, key)


@pytest.mark.parametrize(
    "grpo",
    [
        {"sde_window": "random", "sde_steps": 2, "window_range": 9},
        {"sde_window": "sliding", "sde_steps": 5},
        {"sde_window": "random", "sde_steps": 3, "sde_start": 2, "window_range": 7, "steps_per_trajectory": 1},
    ],
)
def test_windows_that_fit_pass(grpo):
    call_with_sections(check_grpo, config(**grpo))
    call_with_sections(check_grpo, config("flow_matching", sde_type="cps", **grpo))


@pytest.mark.parametrize(
    ("objective", "sde_type", "level", "refused"),
    [
        ("v_prediction", "sde", 1.5, "DDIM with eta"),
        ("epsilon", "sde", 1.0, None),
        ("flow_matching", "cps", 1.2, "sin(a pi / 2)"),
        ("flow_matching", "cps", 0.8, None),
        ("flow_matching", "sde", 1.5, None),  # Flow-GRPO's SDE: any a > 0
    ],
)
def test_a_noise_level_above_what_the_step_can_add_is_refused(objective, sde_type, level, refused):
    """DDIM's eta and CPS's a above 1 would make NaN rollouts or log-probabilities, every group's rewards tie and
    the run train nothing while it reports success."""
    cfg = config(objective, sde_type=sde_type, noise_level=level)
    if refused is None:
        call_with_sections(check_grpo, cfg)
        return
    with pytest.raises(ConfigError) as caught:
        call_with_sections(check_grpo, cfg)
    assert refused in one_paragraph(caught.value, "grpo.noise_level")
