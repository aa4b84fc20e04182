"""Qwen-Image's own text encoder (``conditioner.kind=qwen_image``): the Qwen2.5-VL of a Qwen-Image pipeline folder
(``text_encoder/``, ``tokenizer/`` of ``conditioner.pretrained``), encoding a prompt exactly as
``QwenImagePipeline.encode_prompt`` does, so that an exported pipeline generates what our sampler does.

That is: the prompt put into the pipeline's fixed template (a system turn asking for a detailed image description,
then the prompt as the user's turn and the assistant's turn opened), tokenized to ``max_length`` tokens after the
template's first ``TEMPLATE_TOKENS`` (34, the system turn in Qwen's tokenizer), the **last** layer's hidden states
under the attention mask, and those first 34 rows dropped. The pipeline then pads each prompt's real tokens with
zeros to the batch's longest; here every row is ``max_length`` long, zero past its real tokens, with its mask (the
transformer masks the padding, so a row does not depend on its length).
"""

from __future__ import annotations

import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from dit_trainer.components.conditioners.base import TokenizedConditioner, load_encoder, load_part, tokenize
from dit_trainer.components.kinds import ConditionerKind
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig
from dit_trainer.errors import require

TEXT_ENCODER, TOKENIZER = "text_encoder", "tokenizer"  # the subfolders of a Qwen-Image pipeline folder
MAX_LENGTH = 1024  # QwenImagePipeline's tokenizer_max_length: the most prompt tokens it encodes
# QwenImagePipeline's prompt_template_encode and prompt_template_encode_start_idx: the rows it drops.
TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
TEMPLATE_TOKENS = 34


class QwenImageConditioner(TokenizedConditioner):
    """``encode(prompts) -> Condition``: Qwen2.5-VL's last hidden states (B, ``max_length``, D) of the templated
    prompts past the template's system turn, zero past each prompt's real tokens, and their mask; no pooled
    vector."""

    @property
    def size(self) -> ConditionSize:
        return ConditionSize(self.model.config.get_text_config().hidden_size)

    @torch.no_grad()
    def encode_uncached(self, prompts: list[str]) -> Condition:
        texts = [TEMPLATE.format(prompt) for prompt in prompts]
        # Padded on the right, whatever the tokenizer's setting: the template's first rows are cut by position.
        tokens = tokenize(self.tokenizer, texts, TEMPLATE_TOKENS + self.max_length, padding_side="right")
        tokens = tokens.to(self.device)
        output = self.model(
            input_ids=tokens.input_ids,
            attention_mask=tokens.attention_mask,
            output_hidden_states=True,
            logits_to_keep=1,  # the language-model head's output is not used: one token's, not every token's
        )
        mask = tokens.attention_mask[:, TEMPLATE_TOKENS:]
        hidden = output.hidden_states[-1][:, TEMPLATE_TOKENS:]
        return Condition(hidden * mask[..., None].to(hidden.dtype), mask)


def check(conditioner: ConditionerConfig) -> None:
    """The pipeline encodes at most ``MAX_LENGTH`` tokens of the prompt."""
    te = conditioner
    require(
        te.max_length <= MAX_LENGTH,
        "conditioner.max_length",
        te.max_length,
        f"QwenImagePipeline encodes at most {MAX_LENGTH} tokens of the prompt (after its template's system turn)",
        f"set `conditioner.max_length={MAX_LENGTH}` or less",
    )


def _build(cfg: ConditionerConfig, device: torch.device, dtype: torch.dtype) -> QwenImageConditioner:
    """The Qwen2.5-VL and tokenizer of the pipeline folder ``conditioner.pretrained``, frozen, in ``dtype``, in the
    pipeline's own class (an export hands it on whole); ``conditioner.subfolder``/``tokenizer_subfolder`` override
    the folder's ``text_encoder/`` and ``tokenizer/``."""
    tokenizer = load_part(cfg, AutoTokenizer.from_pretrained, cfg.tokenizer_subfolder or TOKENIZER)
    model = load_encoder(cfg, Qwen2_5_VLForConditionalGeneration, cfg.subfolder or TEXT_ENCODER, dtype)
    return QwenImageConditioner(tokenizer, model.to(device), cfg.max_length, cfg.memo_size)


QWEN_IMAGE_ENCODER = ConditionerKind(_build, check=check)
