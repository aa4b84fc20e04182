"""Z-Image's own text encoder (``conditioner.kind=z_image``): the Qwen3 decoder of a Z-Image pipeline folder
(``text_encoder/``, ``tokenizer/`` of ``conditioner.pretrained``), encoding a prompt exactly as
``ZImagePipeline.encode_prompt`` does, so that an exported pipeline generates what our sampler does.

That is: the prompt as the user turn of the tokenizer's chat template, with the assistant's turn opened and thinking
enabled (no system prompt); the whole text, template included, tokenized to ``max_length`` tokens (the pipeline's
``max_sequence_length``, 512); the **penultimate** layer's hidden states under the attention mask. The pipeline then
keeps each prompt's real tokens only (a list of variable-length rows); here the rows stay padded to ``max_length``
with their mask, and the Z-Image family drops the padding where it calls the transformer.
"""

from __future__ import annotations

import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from dit_trainer.components.conditioners.base import TokenizedConditioner, load_encoder, load_part, tokenize
from dit_trainer.components.kinds import ConditionerKind
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig
from dit_trainer.errors import require

TEXT_ENCODER, TOKENIZER = "text_encoder", "tokenizer"  # the subfolders of a Z-Image pipeline folder
MAX_LENGTH = 512  # ZImagePipeline's default max_sequence_length


def chat_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """``prompt`` as ZImagePipeline hands it to its tokenizer: the user's turn of the chat template, the assistant's
    turn opened, thinking enabled."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)


class ZImageConditioner(TokenizedConditioner):
    """``encode(prompts) -> Condition``: Qwen3's penultimate hidden states (B, ``max_length``, D) of the
    chat-templated prompts, and the mask of their real tokens (the template's included); no pooled vector."""

    @property
    def size(self) -> ConditionSize:
        return ConditionSize(self.model.config.hidden_size)

    @torch.no_grad()
    def encode_uncached(self, prompts: list[str]) -> Condition:
        texts = [chat_prompt(self.tokenizer, prompt) for prompt in prompts]
        tokens = tokenize(self.tokenizer, texts, self.max_length).to(self.device)
        output = self.model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, output_hidden_states=True)
        return Condition(output.hidden_states[-2], tokens.attention_mask)


def check(conditioner: ConditionerConfig) -> None:
    """The pipeline encodes at most ``MAX_LENGTH`` tokens, chat template included."""
    te = conditioner
    require(
        te.max_length <= MAX_LENGTH,
        "conditioner.max_length",
        te.max_length,
        f"ZImagePipeline encodes at most {MAX_LENGTH} tokens of the chat-templated prompt",
        f"set `conditioner.max_length={MAX_LENGTH}` or less",
    )


def _build(cfg: ConditionerConfig, device: torch.device, dtype: torch.dtype) -> ZImageConditioner:
    """The Qwen3 decoder and tokenizer of the pipeline folder ``conditioner.pretrained``, frozen, in ``dtype``;
    ``conditioner.subfolder``/``tokenizer_subfolder`` override the folder's ``text_encoder/`` and ``tokenizer/``."""
    tokenizer = load_part(cfg, AutoTokenizer.from_pretrained, cfg.tokenizer_subfolder or TOKENIZER)
    require(
        tokenizer.chat_template is not None,
        "conditioner.pretrained",
        cfg.pretrained,
        "its tokenizer has no chat template, and Z-Image encodes every prompt as a chat turn",
        "point `conditioner.pretrained` at a Z-Image pipeline folder (its tokenizer/ is Qwen3's, with the template)",
    )
    model = load_encoder(cfg, AutoModel, cfg.subfolder or TEXT_ENCODER, dtype)
    return ZImageConditioner(tokenizer, model.to(device), cfg.max_length, cfg.memo_size)


Z_IMAGE_ENCODER = ConditionerKind(_build, check=check)
