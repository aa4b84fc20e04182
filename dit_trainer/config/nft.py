"""The ``nft`` section: DiffusionNFT reward fine-tuning (``trainer.method=nft``)."""

from __future__ import annotations

from dataclasses import dataclass

from dit_trainer.config.fields import at_least, between, one_of, positive
from dit_trainer.config.online import RolloutConfig


@dataclass
class NFTConfig(RolloutConfig):
    """DiffusionNFT (Zheng et al., 2025): reward fine-tuning on the forward process. Each training step is one epoch:
    every process rolls out ``prompts_per_epoch`` x ``group_size`` images with the old policy (a soft-updated copy
    of the trained weights) and a deterministic sampler, CFG-free by default, keeps only the final images, scores
    them with ``reward``, and turns each image's group advantage into an optimality probability r in [0, 1]. The DiT
    is then trained with the denoising loss of two implicit policies on fresh noise at the rollout's timesteps,
    v+ = (1 - beta) v_old + beta v towards the images with r near 1 and v- = (1 + beta) v_old - beta v away from
    those near 0, weighted adaptively in x0-space. No log-probabilities and no stochastic sampler.
    ``trainer.max_steps`` counts epochs. Read by ``trainer.method=nft`` only."""

    group_size: int = at_least(2, 24, note="advantages compare images of one prompt")  # G: images per prompt
    guidance_scale: float | None = at_least(0, 1.0, note="or null for diffusion.guidance_scale")  # 1: CFG-free
    advantage_std: str = one_of(("group", "global"), "global")  # divide by each group's std or by all rewards'
    # The deterministic sampler of the rollouts (null: diffusion.sampler): any that samples this objective, since
    # only the final images are kept.
    sampler: str | None = None
    # The implicit policies' strength (DiffusionNFT's `beta`; not a KL weight, which is `kl_weight`)
    beta: float = positive(1.0)
    # How many of the rollout's timesteps each image trains per epoch, drawn per image (null: all but the last).
    steps_per_sample: int | None = at_least(1, None, note="or null for all but the last")
    # The weight of the squared distance of v to the starting weights' v. The reference code multiplies its policy
    # loss by adv_clip_max (5) and this one does not: its 1e-4 is 2e-5 here.
    kl_weight: float = at_least(0, 2e-5, note="0 disables it")
    # The old policy that rolls out: after every epoch old <- d old + (1 - d) trained, with d = min(old_decay_rate x
    # (optimizer updates - old_decay_flat), old_decay_max), and d = 0 (on-policy) for the first old_decay_flat.
    old_decay_flat: int = at_least(0, 0)
    old_decay_rate: float = at_least(0, 0.001)
    old_decay_max: float = between(0, 1, 0.5)
