"""The settings every online method shares (``RolloutConfig``), each method's section a subclass of it with its own
defaults: ``grpo.GRPOConfig``, ``nft.NFTConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field

from dit_trainer.config.choices import PROMPT_SAMPLING
from dit_trainer.config.fields import at_least, one_of, positive


@dataclass
class RolloutConfig:
    """What every online method (``trainer.method=grpo``, ``nft``) shares: the prompts it rolls out, how many per
    epoch and how many images each, the sampler steps, and how rewards become advantages within each prompt's group.
    Each method has this in its own section (``grpo.*``, ``nft.*``), with its own defaults."""

    prompts: list[str] = field(default_factory=list)  # what the policy is trained on
    prompt_file: str | None = None  # one prompt per line; used instead of `prompts` when set
    prompts_per_epoch: int = at_least(1, 12)  # per process, drawn without repetition within an epoch
    # uniform: a fresh permutation each epoch | spread: prompts drawn in proportion to their recent within-group
    # reward std (at least a tenth of the largest), so rollouts go where groups disagree, the only place a group
    # advantage teaches anything
    prompt_sampling: str = one_of(PROMPT_SAMPLING, "uniform")
    group_size: int = at_least(2, 16, note="advantages compare images of one prompt")  # G: images per prompt
    sample_steps: int = at_least(2, 10)  # steps of the rollout sampler
    guidance_scale: float | None = at_least(0, None, "set e.g. `{key}=3.0`", "or null for diffusion.guidance_scale")
    rollout_batch_size: int = at_least(1, 64)  # images sampled at once
    adv_clip_max: float = positive(5.0)  # advantages are clamped to +- this
    advantage_std: str = one_of(("group", "global"), "group")  # divide by each group's std or by all rewards'
    eps: float = positive(1e-4, note="it keeps advantages finite for zero-std groups")
    minibatches: int = at_least(1, 1)  # optimizer updates per pass over an epoch's rollouts
    passes: int = at_least(1, 1)  # passes over an epoch's rollouts (after the first, updates are off-policy)
    # The watch on reward hacking (``online.gold``): a reward never trained on, scored every `gold_every` epochs on
    # held-out prompts (none of them a training prompt), `gold_images` per prompt with seeds gold_seed + j, sampled
    # with the EMA weights as users sample (diffusion.*); logged as gold/* beside the training reward on the same
    # images. The best-gold checkpoint is kept from pruning (`checkpoint=best_gold` reads it). With
    # `gold_stop_margin`, the run stops (with a checkpoint) when the gold reward falls that far below its best while
    # the training reward on the same images stands above its value then: the training reward is being gamed.
    gold_reward: str | None = None  # a reward name (`reward.weights`' names) or `package.module:REWARD`
    gold_prompts: list[str] = field(default_factory=list)
    gold_prompt_file: str | None = None  # one prompt per line; used instead of `gold_prompts` when set
    gold_every: int = at_least(1, 10)
    gold_images: int = at_least(1, 4)
    gold_seed: int = 0
    gold_stop_margin: float | None = positive(None, note="or null: never stop")
