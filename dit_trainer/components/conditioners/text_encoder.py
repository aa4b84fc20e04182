"""The frozen text encoder: prompts to padded hidden states, the attention mask that marks real tokens and, where
the family takes one, a pooled vector."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer, CLIPTextModel, PreTrainedModel, T5EncoderModel

from dit_trainer.components import CONDITIONER_KINDS
from dit_trainer.components.conditioners.base import FrozenConditioner, load_encoder, load_part, tokenize
from dit_trainer.components.freeze import freeze
from dit_trainer.components.kinds import Conditioner, ConditionerKind
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig
from dit_trainer.errors import require
from dit_trainer.registry import lookup

# conditioner.kind -> the model class to load: T5 and CLIP checkpoints hold more than their text encoder, so they
# get their encoder-only class; "auto" reads the checkpoint's model type.
MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {"auto": AutoModel, "t5": T5EncoderModel, "clip": CLIPTextModel}
MODEL_TYPE_KINDS = {"t5": "t5", "umt5": "t5", "clip": "clip", "clip_text_model": "clip"}


class FrozenTextEncoder(FrozenConditioner):
    """``encode(prompts) -> Condition``: the last hidden states (B, L, D) with ``L = max_length`` fixed, their mask,
    and with ``pooling`` a pooled vector (B, D): ``mean`` over the real tokens (a sentence-transformer's sentence
    embedding, e.g. MiniLM's), or ``pooler`` (the model's own: CLIP's end-of-text token, BERT's [CLS] head).

    A fixed length keeps batch shapes static (cheap to compile, easy to cache).
    """

    def __init__(
        self, tokenizer, model: PreTrainedModel, max_length: int, memo_size: int = 0, pooling: str = "none"
    ) -> None:
        super().__init__(memo_size)
        self.tokenizer = tokenizer
        self.model = freeze(model)
        self.max_length = max_length
        self.pooling = pooling

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size if hasattr(self.model.config, "hidden_size") else self.model.config.d_model

    @property
    def size(self) -> ConditionSize:
        return ConditionSize(self.hidden_size, None if self.pooling == "none" else self.hidden_size)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.no_grad()
    def encode_uncached(self, prompts: list[str]) -> Condition:
        tokens = tokenize(self.tokenizer, prompts, self.max_length).to(self.device)
        output = self.model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask)
        hidden, mask = output.last_hidden_state, tokens.attention_mask
        pooled = None
        if self.pooling == "mean":
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
        elif self.pooling == "pooler":
            pooled = getattr(output, "pooler_output", None)
            require(
                pooled is not None,
                "conditioner.pooling",
                "pooler",
                f"{type(self.model).__name__} has no pooled output (T5's encoder has none; CLIP's and BERT's do)",
                "set `conditioner.pooling=mean` (the mean over the real tokens)",
            )
        return Condition(hidden, mask, pooled)


def _model_class(cfg: ConditionerConfig) -> type[PreTrainedModel]:
    kind = cfg.kind
    if kind == "auto":
        kind = MODEL_TYPE_KINDS.get(load_part(cfg, AutoConfig.from_pretrained, cfg.subfolder).model_type, "auto")
    return lookup(MODEL_CLASSES, "conditioner.kind", kind)


def _transformers_encoder(cfg: ConditionerConfig, device: torch.device, dtype: torch.dtype) -> FrozenTextEncoder:
    """The configured transformers text encoder and its tokenizer, frozen, on ``device`` in ``dtype``."""
    tokenizer = load_part(cfg, AutoTokenizer.from_pretrained, cfg.tokenizer_subfolder)
    model = load_encoder(cfg, _model_class(cfg), cfg.subfolder, dtype)
    encoder = FrozenTextEncoder(tokenizer, model.to(device), cfg.max_length, cfg.memo_size, cfg.pooling)
    if cfg.pooling == "pooler":
        encoder.encode([""])  # a model without a pooled output is refused now, not at the first step
    return encoder


TRANSFORMERS_ENCODER = ConditionerKind(_transformers_encoder, pooling=True)


def build_text_encoder(cfg: ConditionerConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> Conditioner:
    """The conditioner ``conditioner.kind`` names, frozen, on ``device`` in ``dtype``: a text encoder, or the
    class labels that stand in for one in a class-conditional run."""
    return CONDITIONER_KINDS.get(cfg.kind).build(cfg, device, dtype)
