"""``clip_score``: how well an image matches its prompt, as the cosine similarity of CLIP embeddings."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, CLIPModel, ImageProcessingMixin

from dit_trainer.components.freeze import freeze
from dit_trainer.hub import load_pretrained
from dit_trainer.rewards.base import Reward, check_reward_inputs

CONFIG_KEY = "reward.clip_model"


class CLIPScoreReward:
    """Range [-1, 1]: cosine similarity of CLIP's projected image and text embeddings.

    Preprocessing (resize the short side, centre-crop, normalise) runs in torch on the model's device with the
    sizes and statistics of the model's own ``preprocessor_config.json``, so no image leaves the GPU.
    """

    name = "clip_score"

    def __init__(
        self,
        model: CLIPModel,
        tokenizer,
        crop_size: tuple[int, int],
        resize_to: int,
        mean: Sequence[float],
        std: Sequence[float],
    ) -> None:
        self.model = freeze(model)
        self.tokenizer = tokenizer
        self.crop_size = crop_size
        self.resize_to = resize_to
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)

    def _pixel_values(self, images: torch.Tensor) -> torch.Tensor:
        height, width = images.shape[-2:]
        scale = self.resize_to / min(height, width)
        size = (max(self.crop_size[0], round(height * scale)), max(self.crop_size[1], round(width * scale)))
        resized = F.interpolate(images.float(), size=size, mode="bicubic", antialias=True, align_corners=False)
        top, left = (size[0] - self.crop_size[0]) // 2, (size[1] - self.crop_size[1]) // 2
        cropped = resized[..., top : top + self.crop_size[0], left : left + self.crop_size[1]].clamp(0, 1)
        return (cropped - self.mean.to(images.device)) / self.std.to(images.device)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_reward_inputs(images, prompts)
        device = self.model.device
        pixels = self._pixel_values(images.to(device)).to(self.model.dtype)
        tokens = self.tokenizer(
            list(prompts),
            padding=True,
            truncation=True,
            max_length=self.model.config.text_config.max_position_embeddings,
            return_tensors="pt",
        ).to(device)
        # The projections applied to the pooled outputs, spelled out: get_*_features changed return types
        # across transformers versions.
        image_embeds = self.model.visual_projection(self.model.vision_model(pixel_values=pixels).pooler_output)
        text_embeds = self.model.text_projection(
            self.model.text_model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).pooler_output
        )
        return F.cosine_similarity(image_embeds.float(), text_embeds.float(), dim=-1).to(images.device)


def _size(value: int | dict, short_side: bool) -> tuple[int, int] | int:
    """``preprocessor_config.json`` writes sizes as an int or as a dict, depending on its age."""
    if isinstance(value, int):
        return value if short_side else (value, value)
    if short_side:
        return value.get("shortest_edge") or min(value["height"], value["width"])
    return (value["height"], value["width"])


def load_clip_score(
    name_or_path: str, device: torch.device, dtype: torch.dtype = torch.float32, revision: str | None = None
) -> CLIPScoreReward:
    """A ``CLIPModel`` with its tokenizer and preprocessing statistics, by hub id or local path, frozen."""
    model = load_pretrained(CLIPModel.from_pretrained, name_or_path, CONFIG_KEY, revision=revision, dtype=dtype)
    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, name_or_path, CONFIG_KEY, revision=revision)
    processor, _ = load_pretrained(
        ImageProcessingMixin.get_image_processor_dict, name_or_path, CONFIG_KEY, revision=revision
    )
    crop = _size(processor.get("crop_size", processor["size"]), short_side=False)
    return CLIPScoreReward(
        model.to(device),
        tokenizer,
        crop,
        _size(processor["size"], short_side=True),
        processor["image_mean"],
        processor["image_std"],
    )


CLIP_SCORE = Reward(
    lambda cfg, device, dtype: load_clip_score(cfg.clip_model, device, dtype, cfg.clip_revision),
    models=lambda cfg: {CONFIG_KEY: cfg.clip_model},
)
