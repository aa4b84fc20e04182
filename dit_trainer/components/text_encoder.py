"""The frozen text encoder: prompts to padded hidden states and the attention mask that marks real tokens."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, CLIPTextModel, PreTrainedModel, T5EncoderModel

from dit_trainer.components import TEXT_ENCODER_KINDS
from dit_trainer.components.freeze import freeze
from dit_trainer.components.kinds import Conditioner, ConditionerKind
from dit_trainer.config import TextEncoderConfig
from dit_trainer.hub import load_pretrained
from dit_trainer.registry import lookup

# text_encoder.kind -> the model class to load: T5 and CLIP checkpoints hold more than their text encoder, so they
# get their encoder-only class; "auto" reads the checkpoint's model type.
MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {"auto": AutoModel, "t5": T5EncoderModel, "clip": CLIPTextModel}
MODEL_TYPE_KINDS = {"t5": "t5", "umt5": "t5", "clip": "clip", "clip_text_model": "clip"}


class FrozenTextEncoder(nn.Module):
    """``encode(prompts) -> (embeds (B, L, D), mask (B, L))`` with ``L = max_length`` fixed.

    A fixed length keeps batch shapes static (cheap to compile, easy to cache). With ``memo_size > 0`` the
    embeddings of recent prompts are remembered: the encoder is frozen and deterministic, so this is exact.
    """

    def __init__(self, tokenizer, model: PreTrainedModel, max_length: int, memo_size: int = 0) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.model = freeze(model)
        self.max_length = max_length
        self.memo_size = memo_size
        self._memo: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size if hasattr(self.model.config, "hidden_size") else self.model.config.d_model

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.no_grad()
    def _encode_uncached(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.tokenizer(
            prompts, padding="max_length", max_length=self.max_length, truncation=True, return_tensors="pt"
        ).to(self.device)
        hidden = self.model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state
        return hidden, tokens.attention_mask

    def check_prompts(self, prompts: list[str]) -> None:
        """Every text is a prompt (class labels refuse names they do not know)."""

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.memo_size == 0:
            return self._encode_uncached(list(prompts))
        missing = list(dict.fromkeys(p for p in prompts if p not in self._memo))
        if missing:
            hidden, mask = self._encode_uncached(missing)
            for prompt, h, m in zip(missing, hidden, mask):
                self._memo[prompt] = (h, m)
        for prompt in prompts:
            self._memo.move_to_end(prompt)
        pairs = [self._memo[p] for p in prompts]
        while len(self._memo) > self.memo_size:
            self._memo.popitem(last=False)
        return torch.stack([h for h, _ in pairs]), torch.stack([m for _, m in pairs])


def _load(cfg: TextEncoderConfig, from_pretrained, subfolder: str | None, **kwargs):
    return load_pretrained(
        from_pretrained,
        cfg.pretrained,
        "text_encoder.pretrained",
        subfolder=subfolder or "",
        revision=cfg.revision,
        **kwargs,
    )


def _model_class(cfg: TextEncoderConfig) -> type[PreTrainedModel]:
    kind = cfg.kind
    if kind == "auto":
        kind = MODEL_TYPE_KINDS.get(_load(cfg, AutoConfig.from_pretrained, cfg.subfolder).model_type, "auto")
    return lookup(MODEL_CLASSES, "text_encoder.kind", kind)


def _transformers_encoder(cfg: TextEncoderConfig, device: torch.device, dtype: torch.dtype) -> FrozenTextEncoder:
    """The configured transformers text encoder and its tokenizer, frozen, on ``device`` in ``dtype``."""
    tokenizer = _load(cfg, AutoTokenizer.from_pretrained, cfg.tokenizer_subfolder)
    model = _load(cfg, _model_class(cfg).from_pretrained, cfg.subfolder, dtype=dtype)
    return FrozenTextEncoder(tokenizer, model.to(device), cfg.max_length, cfg.memo_size)


TRANSFORMERS_ENCODER = ConditionerKind(_transformers_encoder)


def build_text_encoder(cfg: TextEncoderConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> Conditioner:
    """The conditioner ``text_encoder.kind`` names, frozen, on ``device`` in ``dtype``: a text encoder, or the
    class labels that stand in for one in a class-conditional run."""
    return TEXT_ENCODER_KINDS.get(cfg.kind).build(cfg, device, dtype)
