"""``call_with_sections``: a hook is handed the config sections its parameters name, and nothing else."""

import dataclasses

import pytest

from dit_trainer.config import DataConfig, TrainConfig, TrainerConfig, call_with_sections


def _config() -> TrainConfig:
    return dataclasses.replace(TrainConfig(), trainer=TrainerConfig(batch_size=3), data=DataConfig(resolution=48))


def test_a_hook_gets_the_sections_it_names_and_what_the_caller_offers_by_name():
    def hook(data: DataConfig, trainer: TrainerConfig, scale: int, unused_default: str = "kept") -> tuple:
        return data.resolution, trainer.batch_size, scale, unused_default

    assert call_with_sections(hook, _config(), scale=2, not_named=object()) == (48, 3, 2, "kept")


def test_a_role_reads_the_section_it_maps_to_and_an_offer_outranks_a_section():
    def hook(rollouts: TrainerConfig, data: str) -> tuple:
        return rollouts.batch_size, data

    assert call_with_sections(hook, _config(), {"rollouts": "trainer"}, data="offered") == (3, "offered")


def test_a_parameter_that_is_neither_a_section_nor_offered_fails_loudly():
    def hook(data: DataConfig, misspelt_sectoin: TrainerConfig) -> None: ...

    with pytest.raises(TypeError, match="misspelt_sectoin"):
        call_with_sections(hook, _config())


def test_an_online_method_reads_its_own_section_as_rollouts():
    from dit_trainer.grpo.method import GRPO
    from dit_trainer.methods.sft import SFT
    from dit_trainer.nft.method import NFT

    cfg = _config()
    cfg = dataclasses.replace(
        cfg,
        grpo=dataclasses.replace(cfg.grpo, passes=2, minibatches=3, prompts_per_epoch=4, group_size=5),
        nft=dataclasses.replace(cfg.nft, passes=1, minibatches=7, prompts_per_epoch=2, group_size=6),
    )
    assert (GRPO.ask(GRPO.updates_per_step, cfg), GRPO.ask(GRPO.images_per_step, cfg)) == (6, 20)
    assert (NFT.ask(NFT.updates_per_step, cfg), NFT.ask(NFT.images_per_step, cfg)) == (7, 12)
    assert (SFT.ask(SFT.updates_per_step, cfg), SFT.ask(SFT.images_per_step, cfg)) == (1, 3)
