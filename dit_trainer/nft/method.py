"""``trainer.method=nft``: DiffusionNFT reward fine-tuning on the old policy's deterministic rollouts (section
``nft``); it reads no data set, and each step of the loop is one epoch of ``nft.passes`` x ``nft.minibatches``
updates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_trainer.online.method import OnlineMethod

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

    from dit_trainer.components.build import Components
    from dit_trainer.config import TrainConfig
    from dit_trainer.training.step import StepParts, TrainingStep


class NFTMethod(OnlineMethod):
    name = "nft"
    section = "nft"
    title = "DiffusionNFT"
    card_tag = "diffusion-nft"

    def check(self, cfg: TrainConfig) -> None:
        from dit_trainer.nft.checks import check_nft

        check_nft(cfg)

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
