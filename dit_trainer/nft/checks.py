"""The ``nft`` section's checks: those every online method shares (``online.checks``), a deterministic rollout
sampler of the run's objective, trained timesteps the sampler has, and a KL term it can build."""

from __future__ import annotations

from dit_trainer.config import TrainConfig
from dit_trainer.diffusion import OBJECTIVES
from dit_trainer.errors import require
from dit_trainer.online.checks import check_online


def check_nft(cfg: TrainConfig) -> None:
    n = cfg.nft
    check_online(cfg, "nft", n)
    samplers = list(OBJECTIVES.get(cfg.diffusion.objective).samplers)
    sampler = n.sampler or cfg.diffusion.sampler
    require(
        sampler in samplers,
        "nft.sampler" if n.sampler else "diffusion.sampler",
        sampler,
        f"DiffusionNFT rolls out with a deterministic sampler and keeps only the final images (a stochastic one, as "
        f"GRPO's SDE, would only add noise to them); the deterministic samplers of `diffusion.objective="
        f"{cfg.diffusion.objective}` are {', '.join(samplers)}",
        f"set `nft.sampler={samplers[0]}`",
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
