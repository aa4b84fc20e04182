"""The ``nft`` section's own checks, after those every online method shares (``online.checks``): a deterministic
rollout sampler of the run's objective, an objective whose x0 errors weigh the timesteps alike, and trained timesteps
the sampler has."""

from __future__ import annotations

from dit_trainer.config import DiffusionConfig, NFTConfig
from dit_trainer.diffusion import OBJECTIVES
from dit_trainer.errors import require


def check_nft(diffusion: DiffusionConfig, nft: NFTConfig) -> None:
    n = nft
    samplers = list(OBJECTIVES.get(diffusion.objective).samplers)
    sampler = n.sampler or diffusion.sampler
    require(
        sampler in samplers,
        "nft.sampler" if n.sampler else "diffusion.sampler",
        sampler,
        f"it is not a sampler of `diffusion.objective={diffusion.objective}`, whose samplers are "
        f"{', '.join(samplers)} (DiffusionNFT rolls out with one of the objective's own deterministic samplers and "
        "keeps only the final images)",
        f"set `nft.sampler={samplers[0]}`",
    )
    require(
        diffusion.objective != "epsilon",
        "diffusion.objective",
        diffusion.objective,
        "DiffusionNFT's loss is measured on the x0 a prediction implies, and for an epsilon model that x0's error is "
        "sqrt((1 - a) / a) times the noise error: about 150 times larger at the noisiest timestep than at the "
        "quietest, so nearly all of the gradient would go to the noisiest steps (v-prediction and flow matching "
        "stay within a factor of 1)",
        "fine-tune an epsilon model with `trainer.method=grpo`, or NFT a v-prediction or flow-matching model",
    )
    trained = n.sample_steps - 1
    require(
        n.steps_per_sample is None or n.steps_per_sample <= trained,
        "nft.steps_per_sample",
        n.steps_per_sample,
        f"an image is trained at the rollout sampler's timesteps but the last, {trained} of them "
        f"(`nft.sample_steps={n.sample_steps}`)",
        f"set `nft.steps_per_sample={trained}` or lower, or null for all of them",
    )
