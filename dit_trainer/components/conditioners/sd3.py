"""SD3's own text encoders (``conditioner.kind=sd3``): CLIP-L, CLIP-G and T5-XXL from the subfolders of one SD3 /
SD3.5 pipeline folder (``conditioner.pretrained``: a hub id or a local copy), giving what
``StableDiffusion3Pipeline.encode_prompt`` computes, so that an exported pipeline generates what our sampler does."""

from __future__ import annotations

import torch
from torch.nn import functional
from transformers import CLIPTextModelWithProjection, PreTrainedModel, T5EncoderModel

from dit_trainer.components.conditioners.base import FrozenConditioner, check_pipeline_folder, load_pair, tokenize
from dit_trainer.components.freeze import freeze
from dit_trainer.components.kinds import ConditionerKind
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig


class SD3Encoders(FrozenConditioner):
    """``encode(prompts) -> Condition`` as ``StableDiffusion3Pipeline.encode_prompt``: ``sequence`` is both CLIPs'
    penultimate hidden states (their tokenizers' 77 tokens) side by side, padded (or cut) to T5's width, followed
    along the sequence by T5's last hidden states (``max_length`` tokens); ``pooled`` is both CLIPs' projected pooled
    outputs side by side.

    The mask is all ones: SD3 attends to every token, padding included. The pipeline passes no attention mask to
    any encoder nor to the transformer, and its weights were trained so; a mask of the real tokens would describe
    a model that does not exist. (CLIP's causal attention keeps padding out of the real tokens' states anyway.)

    The attribute names are the pipeline's components, so an export hands them over by name.
    """

    def __init__(
        self,
        clip_l: tuple[object, CLIPTextModelWithProjection],
        clip_g: tuple[object, CLIPTextModelWithProjection],
        t5: tuple[object, T5EncoderModel],
        max_length: int,
        memo_size: int = 0,
    ) -> None:
        super().__init__(memo_size)
        (self.tokenizer, text_encoder), (self.tokenizer_2, text_encoder_2), (self.tokenizer_3, text_encoder_3) = (
            clip_l,
            clip_g,
            t5,
        )
        self.text_encoder = freeze(text_encoder)
        self.text_encoder_2 = freeze(text_encoder_2)
        self.text_encoder_3 = freeze(text_encoder_3)
        self.max_length = max_length

    @property
    def size(self) -> ConditionSize:
        pooled = self.text_encoder.config.projection_dim + self.text_encoder_2.config.projection_dim
        return ConditionSize(self.text_encoder_3.config.d_model, pooled)

    def _clip(self, tokenizer, encoder: PreTrainedModel, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The pipeline's ``_get_clip_prompt_embeds``: padded to the tokenizer's length, no mask, the penultimate
        layer (and the projected pooled output)."""
        ids = tokenize(tokenizer, prompts, self.tokenizer.model_max_length).input_ids
        output = encoder(ids.to(self.device), output_hidden_states=True)
        return output.hidden_states[-2].to(self.text_encoder.dtype), output[0]

    def encode_uncached(self, prompts: list[str]) -> Condition:
        hidden, pooled = self._clip(self.tokenizer, self.text_encoder, prompts)
        hidden_2, pooled_2 = self._clip(self.tokenizer_2, self.text_encoder_2, prompts)
        ids = tokenize(self.tokenizer_3, prompts, self.max_length, add_special_tokens=True).input_ids
        t5 = self.text_encoder_3(ids.to(self.device))[0].to(self.text_encoder_3.dtype)
        clip = torch.cat([hidden, hidden_2], dim=-1)
        clip = functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        sequence = torch.cat([clip, t5], dim=-2)
        mask = torch.ones(sequence.shape[:2], dtype=torch.long, device=sequence.device)
        return Condition(sequence, mask, torch.cat([pooled, pooled_2], dim=-1))


def check(conditioner: ConditionerConfig) -> None:
    check_pipeline_folder(
        conditioner,
        "text_encoder/, text_encoder_2/, text_encoder_3/ and tokenizer/, tokenizer_2/, tokenizer_3/",
        "SD3 was trained with 77 and 256",
    )


def _build(cfg: ConditionerConfig, device: torch.device, dtype: torch.dtype) -> SD3Encoders:
    return SD3Encoders(
        load_pair(cfg, "", CLIPTextModelWithProjection, device, dtype),
        load_pair(cfg, "_2", CLIPTextModelWithProjection, device, dtype),
        load_pair(cfg, "_3", T5EncoderModel, device, dtype),
        cfg.max_length,
        cfg.memo_size,
    )


SD3_ENCODERS = ConditionerKind(_build, check=check)
