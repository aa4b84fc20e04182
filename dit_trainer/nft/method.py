"""``trainer.method=nft``: DiffusionNFT reward fine-tuning on the old policy's deterministic rollouts (section
``nft``); it reads no data set, and each step of the loop is one epoch of ``nft.passes`` x ``nft.minibatches``
updates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_trainer.methods.base import Method

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

    from dit_trainer.components.build import Components
    from dit_trainer.config import TrainConfig
    from dit_trainer.training.step import StepParts, TrainingStep


class NFTMethod(Method):
    name = "nft"
    section = "nft"
    reads_data = False
    scores_rewards = True
    card_tag = "diffusion-nft"

    def check(self, cfg: TrainConfig) -> None:
        from dit_trainer.nft.checks import check_nft

        check_nft(cfg)

    def updates_per_step(self, cfg: TrainConfig) -> int:
        return cfg.nft.passes * cfg.nft.minibatches

    def images_per_step(self, cfg: TrainConfig) -> int:
        return cfg.nft.prompts_per_epoch * cfg.nft.group_size

    def describe_inputs(self, cfg: TrainConfig) -> str:
        n = cfg.nft
        return f"DiffusionNFT rollouts: {n.prompts_per_epoch} prompts x {n.group_size} images per process"

    def describe(self, cfg: TrainConfig) -> str:
        rewards = ", ".join(f"{name} x {weight:g}" for name, weight in cfg.reward.weights.items())
        return f"DiffusionNFT reward fine-tuning (rewards: {rewards})"

    def build_step(
        self,
        cfg: TrainConfig,
        loop: StepParts,
        parts: Components,
        frozen_dtype: torch.dtype,
        dataloader: DataLoader | None,
    ) -> TrainingStep:
        from dit_trainer.nft.build import build_nft_step

        return build_nft_step(cfg, loop, parts, frozen_dtype)


NFT = NFTMethod()
