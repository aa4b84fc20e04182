"""``trainer.method=nft``: DiffusionNFT reward fine-tuning on the old policy's deterministic rollouts (section
``nft``); it reads no data set, and each step of the loop is one epoch of ``nft.passes`` x ``nft.minibatches``
updates."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from dit_trainer.online.method import OnlineMethod

if TYPE_CHECKING:
    from dit_trainer.training.step import TrainingStep


class NFTMethod(OnlineMethod):
    name = "nft"
    section = "nft"
    title = "DiffusionNFT"
    card_tag = "diffusion-nft"

    @property
    def check(self) -> Callable[..., None]:
        """``nft.checks.check_nft``, imported when asked: its module loads torch."""
        from dit_trainer.nft.checks import check_nft

        return check_nft

    @property
    def build_step(self) -> Callable[..., TrainingStep]:
        """``nft.build.build_nft_step``."""
        from dit_trainer.nft.build import build_nft_step

        return build_nft_step


NFT = NFTMethod()
