"""FLUX.1's own text encoders (``conditioner.kind=flux``): CLIP-L's pooled output and T5's hidden states, read from
one Flux pipeline folder (``conditioner.pretrained``: ``tokenizer/`` + ``text_encoder/``, ``tokenizer_2/`` +
``text_encoder_2/``), computed exactly as ``FluxPipeline.encode_prompt`` does, so an exported pipeline conditions
as our sampler does."""

from __future__ import annotations

import torch
from transformers import CLIPTextModel, T5EncoderModel

from dit_trainer.components.conditioners.base import FrozenConditioner, check_pipeline_folder, load_pair, tokenize
from dit_trainer.components.freeze import freeze
from dit_trainer.components.kinds import ConditionerKind
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig


class FluxConditioner(FrozenConditioner):
    """``encode(prompts) -> Condition``: T5's last hidden states (B, ``max_length``, D), padded to ``max_length`` and
    computed with no attention mask, and CLIP-L's pooled output (B, 768) of the prompt padded to the CLIP tokenizer's
    ``model_max_length`` (77), FluxPipeline's ``prompt_embeds`` and ``pooled_prompt_embeds``. The mask marks T5's real
    tokens; Flux attends to all of them, padding included, as its pipeline does."""

    def __init__(
        self, tokenizer, clip: CLIPTextModel, tokenizer_2, t5: T5EncoderModel, max_length: int, memo_size: int = 0
    ) -> None:
        super().__init__(memo_size)
        self.tokenizer, self.tokenizer_2 = tokenizer, tokenizer_2
        self.clip, self.t5 = freeze(clip), freeze(t5)
        self.max_length = max_length

    @property
    def size(self) -> ConditionSize:
        return ConditionSize(self.t5.config.d_model, self.clip.config.hidden_size)

    @torch.no_grad()
    def encode_uncached(self, prompts: list[str]) -> Condition:
        clip_ids = tokenize(self.tokenizer, prompts, self.tokenizer.model_max_length).input_ids
        pooled = self.clip(clip_ids.to(self.clip.device), output_hidden_states=False).pooler_output
        tokens = tokenize(self.tokenizer_2, prompts, self.max_length)
        hidden = self.t5(tokens.input_ids.to(self.device), output_hidden_states=False)[0]
        return Condition(hidden, tokens.attention_mask.to(self.device), pooled)


def check(conditioner: ConditionerConfig) -> None:
    check_pipeline_folder(
        conditioner, "tokenizer/, text_encoder/, tokenizer_2/ and text_encoder_2/", "FLUX.1-dev: 512, schnell: 256"
    )


def _build(cfg: ConditionerConfig, device: torch.device, dtype: torch.dtype) -> FluxConditioner:
    """CLIP-L and T5 with their tokenizers from the subfolders of ``conditioner.pretrained``, frozen."""
    tokenizer, clip = load_pair(cfg, "", CLIPTextModel, device, dtype)
    tokenizer_2, t5 = load_pair(cfg, "_2", T5EncoderModel, device, dtype)
    return FluxConditioner(tokenizer, clip, tokenizer_2, t5, cfg.max_length, cfg.memo_size)


FLUX_ENCODERS = ConditionerKind(_build, check=check)
