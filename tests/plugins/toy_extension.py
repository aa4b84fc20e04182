"""A model family, a data source and a reward that live outside dit-trainer, as a user's own would: named on the
command line by import path (``model.family=toy_extension:TOY_FAMILY``), with no file of the package edited.

The family is a small convolutional denoiser (a diffusers ``ModelMixin``, so checkpoints and sampling work as for
any family); the source is solid-colour images captioned with their colour; the reward is the images' brightness.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn
from torch.utils.data import Dataset

from dit_trainer.components.families.base import ExportParts, Family, PipelineExport
from dit_trainer.condition import ConditionSize
from dit_trainer.config import LoRAConfig, ModelConfig
from dit_trainer.data.sources.source import Source
from dit_trainer.errors import ConfigError, require
from dit_trainer.rewards.base import Reward

COLORS = {"red": (1.0, -1.0, -1.0), "green": (-1.0, 1.0, -1.0), "blue": (-1.0, -1.0, 1.0), "white": (1.0, 1.0, 1.0)}


class ToyTransformer(ModelMixin, ConfigMixin):
    """x_t, the timestep and the mean text feature, mixed by two convolutions."""

    @register_to_config
    def __init__(
        self,
        in_channels: int = 4,
        out_channels: int = 4,
        condition_dim: int = 384,
        hidden: int = 32,
        sample_size: int = 16,
        patch_size: int = 1,  # every family's config has these three: the trainer reads them
    ) -> None:
        super().__init__()
        self.proj_in = nn.Conv2d(in_channels, hidden, 3, padding=1)
        self.time = nn.Linear(1, hidden)
        self.text = nn.Linear(condition_dim, hidden)
        self.proj_out = nn.Conv2d(hidden, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask[..., None].to(embeds.dtype)
        text = (embeds * weights).sum(1) / weights.sum(1).clamp(min=1)
        condition = self.time(t.to(x.dtype)[:, None] / 1000) + self.text(text)
        return self.proj_out(F.silu(self.proj_in(x) + condition[..., None, None]))


def _check(lora: LoRAConfig) -> None:
    require(not lora.enabled, "lora.enabled", True, "the toy family has no LoRA targets", "train it in full")


def _build(cfg: ModelConfig, in_channels: int, sample_size: int, condition: ConditionSize) -> ToyTransformer:
    return ToyTransformer(in_channels, in_channels, condition.sequence, cfg.attention_head_dim, sample_size)


def _export(parts: ExportParts) -> PipelineExport:
    raise ConfigError(
        "model.family", "toy", "the toy family has no diffusers pipeline", "sample with scripts/sample.py"
    )


TOY_FAMILY = Family(
    transformer_class=ToyTransformer,
    build=_build,
    mismatch=lambda config, in_channels, condition_size: None,
    predict=lambda transformer, x_t, t, condition: transformer(
        x_t, t.expand(x_t.shape[0]), condition.sequence, condition.mask
    ),
    pipeline="none",
    export=_export,
    check=_check,
    input_layer="proj_in",
)


class SolidColors(Dataset):
    """``length`` images of one colour each, captioned ``"a red image"``, ..."""

    def __init__(self, length: int, resolution: int) -> None:
        self.length, self.resolution = length, resolution

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        name, rgb = list(COLORS.items())[index % len(COLORS)]
        image = torch.tensor(rgb).view(3, 1, 1).expand(3, self.resolution, self.resolution).clone()
        return {"image": image, "caption": f"a {name} image"}


TOY_SOURCE = Source(lambda cfg: SolidColors(cfg.length, cfg.resolution))


class Brightness:
    """The images' mean brightness in [0, 1]."""

    name = "brightness"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts) -> torch.Tensor:
        return images.float().mean(dim=(1, 2, 3))


TOY_REWARD = Reward(lambda cfg, device, dtype: Brightness())
