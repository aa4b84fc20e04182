"""The sections of reward fine-tuning: which rewards score images (``reward``) and GRPO training itself (``grpo``).
(The periodic reward monitor is ``monitor.reward``, in ``monitors``.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from dit_trainer.config.choices import SDE_TYPES, SDE_WINDOWS
from dit_trainer.config.fields import at_least, between, one_of, positive
from dit_trainer.config.online import RolloutConfig


@dataclass
class RewardConfig:
    """Rewards of generated images: a weighted sum of named reward functions (``dit_trainer.rewards.REWARDS``)."""

    # name -> weight. Empty here so that a config group option replaces it rather than merging.
    weights: dict[str, float] = field(default_factory=dict)
    clip_model: str = "openai/clip-vit-base-patch32"  # clip_score: hub id or local path of a transformers CLIPModel
    clip_revision: str | None = None
    jpeg_quality: int = between(1, 100, 95)  # jpeg_compressibility: the JPEG quality the images are encoded at


@dataclass
class GRPOConfig(RolloutConfig):
    """GRPO reward fine-tuning (Flow-GRPO for flow matching, DDPO's DDIM-eta for epsilon / v). Each training step is
    one epoch: every process rolls out ``prompts_per_epoch`` x ``group_size`` images with the current (raw) weights
    and a stochastic sampler, scores them with ``reward``, normalises the rewards within each prompt's group, and
    updates the DiT on the PPO-clipped ratio of the log-probabilities of its own sampling steps. No gradient flows
    through images. ``trainer.max_steps`` counts epochs; ``optim.lr`` is the learning rate. Read by
    ``trainer.method=grpo`` only."""

    # Noise of the stochastic sampler: flow matching's a (std a sqrt(sigma / (1 - sigma)); null: 0.7) or DDIM's
    # eta (null: 1.0). It must be > 0: the deterministic sampler has no log-probability to train; DDIM's eta and
    # the cps step's a at most 1 (above, the step asks for more noise than it may add).
    noise_level: float | None = positive(None, note="or null for the family's default")
    # Flow matching's stochastic step: sde (Flow-GRPO's SDE, std a sqrt(sigma / (1 - sigma))) | cps (its
    # coefficients-preserving sampler, std sigma' sin(a pi / 2), Flow-GRPO-Fast's; a = 0.8 is its usual level).
    # Epsilon / v models have DDIM-eta only.
    sde_type: str = one_of(SDE_TYPES, "sde")
    # The window of steps that draw noise and are trained (the others are the deterministic sampler's): from step
    # `sde_start`, `sde_steps` of them (null: every step that can; the last is always deterministic).
    sde_start: int = at_least(0, 0)
    sde_steps: int | None = at_least(1, None, note="or null for all")
    # Where the window sits each epoch. fixed: always at `sde_start`. random: Flow-GRPO-Fast's, a start drawn each
    # epoch (from the run's checkpointed generator) so that the window lies within the `window_range` steps from
    # `sde_start`. sliding: MixGRPO's, from `sde_start` one step later every `slide_every` epochs, back to
    # `sde_start` once it has reached the range's end. A moving window needs its size, `sde_steps`. Its epoch count
    # and position are in the checkpoint (grpo_window.json).
    sde_window: str = one_of(SDE_WINDOWS, "fixed")
    # random / sliding: the window lies within this many steps from `sde_start` (null: half of the sampler's, as
    # Flow-GRPO-Fast: the early steps, where the image's layout is decided).
    window_range: int | None = at_least(1, None, note="or null for half of grpo.sample_steps")
    slide_every: int = at_least(1, 1)  # sliding: the epochs the window stays at one position
    # Roll the deterministic steps before the window out once per prompt and branch into the group's images at the
    # window (Flow-GRPO-Fast): a group's images then share their initial noise and differ only by the window's.
    shared_prefix: bool = False
    # Finish each image after the window in this many deterministic steps spread over the rest of the sampler's grid
    # instead of all of them (MixGRPO-Flash's compressed tail; it takes a second-order solver, this the sampler's own
    # step): nothing after the window is trained, only the final image is scored, so a coarser finish makes rollouts
    # cheaper. The reward monitor, samples and evaluation keep the full sampler. Null: every step.
    tail_steps: int | None = at_least(1, None, note="or null for every step")
    # Of the window's steps, how many each trajectory trains per epoch: a random subset per trajectory (DanceGRPO's
    # and Flow-GRPO's timestep_fraction), for cheaper updates and so more epochs. Null: every step of the window.
    steps_per_trajectory: int | None = at_least(1, None, note="or null for every step of the window")
    clip_range: float = positive(1e-4)  # PPO's clip of the ratio, on the per-dimension mean log-prob scale
    filter_zero_std: bool = True  # skip the samples of groups whose rewards are all equal (their advantage is 0)
    beta: float = at_least(0, 0.0, note="0 disables the KL penalty")  # KL to the starting policy
    # With CFG, also train the empty-prompt prediction that every prompt's guided step shares. Off: updates reach
    # only the conditional half (the unconditional one is used as is), so prompts do not pull it in conflicting
    # directions.
    train_unconditional: bool = True
    # The earlier spellings of `trainer.method=grpo`, `trainer.init_from`, `trainer.init_ema` and
    # `trainer.init_weights`: still read (with a warning naming the new key; every earlier config.yaml has them),
    # written only empty.
    enabled: bool = False
    init_from: str | None = None
    init_ema: bool | None = None
    init_weights: str | None = None
