"""Wan's own text encoder (``conditioner.kind=wan``): the UMT5 of a Wan pipeline folder (``text_encoder/``,
``tokenizer/`` of ``conditioner.pretrained``), encoding a prompt exactly as ``WanPipeline.encode_prompt`` does, so
that an exported pipeline generates what our sampler does.

That is: the prompt cleaned as the pipeline cleans it (its own ``prompt_clean``: ftfy where installed, HTML entities,
whitespace), tokenized to ``max_length`` tokens, UMT5's last hidden states under the attention mask, and every row
past the prompt's real tokens set to zero. The transformer gets no mask (Wan attends to the zero rows, as it was
trained to), so the mask is kept only for the caches.

UMT5 has a relative-position table in every layer, T5 only in its first: loading a UMT5 checkpoint as
``T5EncoderModel`` (``conditioner.kind=t5``) would drop the others, so this kind loads ``UMT5EncoderModel``.
"""

from __future__ import annotations

import torch
from diffusers.pipelines.wan.pipeline_wan import prompt_clean
from transformers import AutoTokenizer, UMT5EncoderModel

from dit_trainer.components.conditioners.base import TokenizedConditioner, load_encoder, load_part, tokenize
from dit_trainer.components.kinds import ConditionerKind
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig
from dit_trainer.errors import require

TEXT_ENCODER, TOKENIZER = "text_encoder", "tokenizer"  # the subfolders of a Wan pipeline folder
MAX_LENGTH = 512  # WanPipeline.__call__'s max_sequence_length (its encode_prompt's own default is 226)


class WanConditioner(TokenizedConditioner):
    """``encode(prompts) -> Condition``: UMT5's last hidden states (B, ``max_length``, D) of the cleaned prompts, zero
    past each prompt's real tokens, and their mask; no pooled vector."""

    @property
    def size(self) -> ConditionSize:
        return ConditionSize(self.model.config.d_model)

    @torch.no_grad()
    def encode_uncached(self, prompts: list[str]) -> Condition:
        tokens = tokenize(self.tokenizer, [prompt_clean(p) for p in prompts], self.max_length, add_special_tokens=True)
        tokens = tokens.to(self.device)
        hidden = self.model(tokens.input_ids, tokens.attention_mask).last_hidden_state
        return Condition(hidden * tokens.attention_mask[..., None].to(hidden.dtype), tokens.attention_mask)


def check(conditioner: ConditionerConfig) -> None:
    """The pipeline encodes at most ``MAX_LENGTH`` tokens of the prompt."""
    require(
        conditioner.max_length <= MAX_LENGTH,
        "conditioner.max_length",
        conditioner.max_length,
        f"WanPipeline encodes at most {MAX_LENGTH} UMT5 tokens of the prompt (its max_sequence_length)",
        f"set `conditioner.max_length={MAX_LENGTH}` or less",
    )


def _build(cfg: ConditionerConfig, device: torch.device, dtype: torch.dtype) -> WanConditioner:
    """The UMT5 and tokenizer of the pipeline folder ``conditioner.pretrained``, frozen, in ``dtype``;
    ``conditioner.subfolder``/``tokenizer_subfolder`` override the folder's ``text_encoder/`` and ``tokenizer/``."""
    tokenizer = load_part(cfg, AutoTokenizer.from_pretrained, cfg.tokenizer_subfolder or TOKENIZER)
    model = load_encoder(cfg, UMT5EncoderModel, cfg.subfolder or TEXT_ENCODER, dtype)
    return WanConditioner(tokenizer, model.to(device), cfg.max_length, cfg.memo_size)


WAN_ENCODER = ConditionerKind(_build, check=check)
