"""The PixArt family (``components/families/pixart.py``): a pretrained PixArt with micro-conditions loads and runs,
and one whose caption projection does not fit the text encoder is refused."""

import pytest
import torch
from diffusers import PixArtTransformer2DModel

from dit_trainer.components.dit import DiTAdapter, build_dit
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ModelConfig
from dit_trainer.errors import ConfigError


def test_pretrained_pixart_with_micro_conditions_loads_and_runs(tmp_path):
    torch.manual_seed(0)
    PixArtTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=4,
        out_channels=8,
        num_layers=1,
        cross_attention_dim=24,
        sample_size=8,
        patch_size=2,
        caption_channels=16,
        use_additional_conditions=True,
    ).save_pretrained(tmp_path / "transformer")
    dit = build_dit(ModelConfig(pretrained=str(tmp_path), subfolder="transformer"), 4, 8, ConditionSize(16))
    assert isinstance(dit, DiTAdapter) and dit.transformer.config.use_additional_conditions
    out = dit(
        torch.randn(2, 4, 8, 8),
        torch.tensor([10]),
        Condition(torch.randn(2, 3, 16), torch.ones(2, 3, dtype=torch.long)),
    )
    assert out.shape == (2, 4, 8, 8)
    with pytest.raises(ConfigError, match="text encoder"):
        build_dit(ModelConfig(pretrained=str(tmp_path), subfolder="transformer"), 4, 8, ConditionSize(384))
