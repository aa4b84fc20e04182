"""FLUX.2 [klein]'s own text encoder (``conditioner.kind=flux2``): the Qwen3 of a FLUX.2 klein pipeline folder
(``text_encoder/``, ``tokenizer/`` of ``conditioner.pretrained``), encoding a prompt exactly as
``Flux2KleinPipeline.encode_prompt`` does, so that an exported pipeline generates what our sampler does.

That is: the prompt as the user's turn of the tokenizer's chat template, the assistant's turn opened with thinking
disabled (no system prompt), padded to ``max_length`` tokens (512, the pipeline's ``max_sequence_length``); the
hidden states of layers 9, 18 and 27 (``HIDDEN_LAYERS``) side by side, three times the encoder's width per token
(Qwen3-4B: 7,680, Qwen3-8B: 12,288). The transformer attends to every token, padding included (the pipeline passes
no mask), so the mask is kept for the cache and the statistics only.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from dit_trainer.components.conditioners.base import TokenizedConditioner, load_encoder, load_part, tokenize
from dit_trainer.components.kinds import ConditionerKind
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig
from dit_trainer.errors import require

TEXT_ENCODER, TOKENIZER = "text_encoder", "tokenizer"  # the subfolders of a FLUX.2 klein pipeline folder
MAX_LENGTH = 512  # Flux2KleinPipeline's tokenizer_max_length
HIDDEN_LAYERS = (9, 18, 27)  # Flux2KleinPipeline's text_encoder_out_layers: indices into Qwen3's hidden states


def chat_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> str:
    """``prompt`` as Flux2KleinPipeline hands it to its tokenizer: the user's turn of the chat template, the
    assistant's turn opened, thinking disabled."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)


class Flux2Conditioner(TokenizedConditioner):
    """``encode(prompts) -> Condition``: Qwen3's hidden states of layers ``HIDDEN_LAYERS``, concatenated per token
    (B, ``max_length``, 3 D), of the chat-templated prompts, and their mask; no pooled vector."""

    @property
    def size(self) -> ConditionSize:
        return ConditionSize(len(HIDDEN_LAYERS) * self.model.config.hidden_size)

    @torch.no_grad()
    def encode_uncached(self, prompts: list[str]) -> Condition:
        texts = [chat_prompt(self.tokenizer, prompt) for prompt in prompts]
        tokens = tokenize(self.tokenizer, texts, self.max_length).to(self.device)
        output = self.model(
            input_ids=tokens.input_ids,
            attention_mask=tokens.attention_mask,
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=1,  # the language-model head's output is not used: one token's, not max_length's
        )
        return Condition(torch.cat([output.hidden_states[k] for k in HIDDEN_LAYERS], dim=-1), tokens.attention_mask)


def check(conditioner: ConditionerConfig) -> None:
    """The pipeline encodes at most ``MAX_LENGTH`` tokens, chat template included."""
    te = conditioner
    require(
        te.max_length <= MAX_LENGTH,
        "conditioner.max_length",
        te.max_length,
        f"Flux2KleinPipeline encodes at most {MAX_LENGTH} tokens of the chat-templated prompt",
        f"set `conditioner.max_length={MAX_LENGTH}` or less",
    )


def _build(cfg: ConditionerConfig, device: torch.device, dtype: torch.dtype) -> Flux2Conditioner:
    """The Qwen3 (the pipeline's own class, with its language-model head: an export hands it on whole) and tokenizer
    of the pipeline folder ``conditioner.pretrained``, frozen, in ``dtype``;
    ``conditioner.subfolder``/``tokenizer_subfolder`` override the folder's ``text_encoder/`` and ``tokenizer/``.
    A decoder of fewer layers than the deepest one read is refused."""
    tokenizer = load_part(cfg, AutoTokenizer.from_pretrained, cfg.tokenizer_subfolder or TOKENIZER)
    require(
        tokenizer.chat_template is not None,
        "conditioner.pretrained",
        cfg.pretrained,
        "its tokenizer has no chat template, and FLUX.2 encodes every prompt as a chat turn",
        "point `conditioner.pretrained` at a FLUX.2 klein pipeline folder (its tokenizer/ is Qwen3's, with the "
        "template)",
    )
    model = load_encoder(cfg, AutoModelForCausalLM, cfg.subfolder or TEXT_ENCODER, dtype)
    layers = model.config.num_hidden_layers
    require(
        layers >= max(HIDDEN_LAYERS),
        "conditioner.pretrained",
        cfg.pretrained,
        f"its text encoder has {layers} layers, and FLUX.2 reads the hidden states of layers {HIDDEN_LAYERS}",
        "point `conditioner.pretrained` at a FLUX.2 klein pipeline folder (Qwen3-4B or Qwen3-8B)",
    )
    return Flux2Conditioner(tokenizer, model.to(device), cfg.max_length, cfg.memo_size)


FLUX2_ENCODER = ConditionerKind(_build, check=check)
