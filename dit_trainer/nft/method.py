"""``trainer.method=nft``: DiffusionNFT reward fine-tuning on the old policy's deterministic rollouts (section
``nft``); it reads no data set, and each step of the loop is one epoch of ``nft.passes`` x ``nft.minibatches``
updates."""

from __future__ import annotations

from dit_trainer.online.method import OnlineMethod


class NFTMethod(OnlineMethod):
    name = "nft"
    section = "nft"
    title = "DiffusionNFT"
    card_tag = "diffusion-nft"
    own_check = "dit_trainer.nft.checks:check_nft"
    step_builder = "dit_trainer.nft.build:build_nft_step"


NFT = NFTMethod()
