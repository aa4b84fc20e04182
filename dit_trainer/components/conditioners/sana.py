"""Sana's conditioner (``conditioner.kind=sana``): the Gemma-2 decoder of a Sana pipeline folder
(``text_encoder/``, ``tokenizer/`` of ``conditioner.pretrained``), encoding a prompt exactly as
``SanaPipeline.encode_prompt`` does, so that an exported pipeline generates what our sampler does.

That is: the prompt lower-cased and stripped (the pipeline's ``clean_caption=False`` preprocessing), the tokenizer
padding on the right, and with an instruction (``conditioner.instruction``, the pipeline's
``complex_human_instruction``) the lines joined by newlines and put before the prompt, the whole tokenized to
``instruction tokens + max_length - 2`` and then cut to ``max_length`` rows: the first token (``<bos>``) and the last
``max_length - 1`` (the paper's section 3.1, the pipeline's ``select_index``). The empty prompt, CFG's unconditional
branch and caption dropout's stand-in, is encoded without the instruction, as the pipeline encodes its negative
prompt.
"""

from __future__ import annotations

import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedModel

from dit_trainer.components.conditioners.base import TokenizedConditioner, load_encoder, load_part, tokenize
from dit_trainer.components.kinds import ConditionerKind
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig

TEXT_ENCODER, TOKENIZER = "text_encoder", "tokenizer"  # the subfolders of a Sana pipeline folder


class SanaConditioner(TokenizedConditioner):
    """``encode(prompts) -> Condition``: Gemma-2's last hidden states (B, max_length, D) and their mask, no pooled
    vector (Sana's transformer takes none)."""

    def __init__(
        self, tokenizer, model: PreTrainedModel, max_length: int, instruction: list[str], memo_size: int = 0
    ) -> None:
        super().__init__(tokenizer, model, max_length, memo_size)
        self.tokenizer.padding_side = "right"  # what SanaPipeline sets before every encode
        self.instruction = "\n".join(instruction)

    @property
    def size(self) -> ConditionSize:
        return ConditionSize(self.model.config.hidden_size)

    def _encode(self, texts: list[str], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = tokenize(self.tokenizer, texts, length, add_special_tokens=True).to(self.device)
        hidden = self.model(tokens.input_ids, attention_mask=tokens.attention_mask)[0]
        return hidden, tokens.attention_mask

    @torch.no_grad()
    def encode_uncached(self, prompts: list[str]) -> Condition:
        texts = [prompt.lower().strip() for prompt in prompts]
        instructed = [i for i, text in enumerate(texts) if self.instruction and text]
        plain = [i for i, text in enumerate(texts) if i not in instructed]
        rows: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []
        if instructed:
            length = len(self.tokenizer.encode(self.instruction)) + self.max_length - 2
            embeds, masks = self._encode([self.instruction + texts[i] for i in instructed], length)
            keep = [0, *range(length - self.max_length + 1, length)]  # <bos> and the last max_length - 1 tokens
            rows.append((instructed, embeds[:, keep], masks[:, keep]))
        if plain:
            rows.append((plain, *self._encode([texts[i] for i in plain], self.max_length)))
        order = [i for indices, _, _ in rows for i in indices]
        hidden = torch.cat([embeds for _, embeds, _ in rows])
        mask = torch.cat([masks for _, _, masks in rows])
        inverse = torch.argsort(torch.tensor(order, device=hidden.device))
        return Condition(hidden[inverse], mask[inverse])


def build(cfg: ConditionerConfig, device: torch.device, dtype: torch.dtype) -> SanaConditioner:
    """The Gemma-2 decoder and tokenizer of the pipeline folder ``conditioner.pretrained``, frozen, in ``dtype``;
    ``conditioner.subfolder``/``tokenizer_subfolder`` override the folder's ``text_encoder/`` and ``tokenizer/``."""
    tokenizer = load_part(cfg, AutoTokenizer.from_pretrained, cfg.tokenizer_subfolder or TOKENIZER)
    model = load_encoder(cfg, AutoModel, cfg.subfolder or TEXT_ENCODER, dtype)
    return SanaConditioner(tokenizer, model.to(device), cfg.max_length, list(cfg.instruction), cfg.memo_size)


SANA_ENCODER = ConditionerKind(build, instruction=True)
