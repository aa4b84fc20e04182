"""What every conditioner made of frozen encoders shares: an exact memo of recent prompts, and loading its parts
from the subfolders of one pipeline folder (``conditioner.pretrained``)."""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import nn
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from dit_trainer.components.freeze import freeze
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig
from dit_trainer.errors import ModelLoadError, require, shortlist
from dit_trainer.hub import load_pretrained, pretrained_config

T = TypeVar("T")
M = TypeVar("M", bound=PreTrainedModel)
logger = logging.getLogger(__name__)
T5_MAX_LENGTH = 512  # StableDiffusion3Pipeline and FluxPipeline refuse a longer max_sequence_length


class FrozenConditioner(nn.Module):
    """``encode(prompts) -> Condition`` under ``no_grad``. Subclasses give ``encode_uncached`` and ``size``; with
    ``memo_size > 0`` the conditions of recent prompts are remembered, which is exact because every encoder here is
    frozen and deterministic, and because the memo encodes one prompt at a time: an encoder's row changes in its
    last bits with the batch it is computed in (CLIP's and T5's do), so a memo filled batch by batch would depend on
    the order prompts came in, and a resumed run would differ from the uninterrupted one. The empty prompt alone
    (caption dropout's and CFG's, asked for every step) is remembered even without a memo."""

    def __init__(self, memo_size: int = 0) -> None:
        super().__init__()
        self.memo_size = memo_size
        self._memo: OrderedDict[str, Condition] = OrderedDict()
        self._empty: Condition | None = None

    @property
    def size(self) -> ConditionSize:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def encode_uncached(self, prompts: list[str]) -> Condition:
        raise NotImplementedError

    def check_prompts(self, prompts: Sequence[str]) -> None:
        """Every text is a prompt (class labels refuse names they do not know)."""

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> Condition:
        if self.memo_size == 0:
            if list(prompts) != [""]:
                return self.encode_uncached(list(prompts))
            if self._empty is None:
                self._empty = self.encode_uncached([""])
            return self._empty
        missing = list(dict.fromkeys(p for p in prompts if p not in self._memo))
        for prompt in missing:
            self._memo[prompt] = self.encode_uncached([prompt]).rows(0)
        for prompt in prompts:
            self._memo.move_to_end(prompt)
        condition = Condition.stack([self._memo[p] for p in prompts])
        while len(self._memo) > self.memo_size:
            self._memo.popitem(last=False)
        return condition


class TokenizedConditioner(FrozenConditioner):
    """A conditioner of one tokenizer and one frozen encoder (Sana's, Z-Image's, Qwen-Image's, FLUX.2's, Wan's), each
    prompt tokenized to ``max_length`` tokens; subclasses say how the encoder reads them (``encode_uncached``) and
    what width it gives (``size``)."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, max_length: int, memo_size: int = 0
    ) -> None:
        super().__init__(memo_size)
        self.tokenizer = tokenizer
        self.model = freeze(model)
        self.max_length = max_length


_CUT_WARNED: set[tuple[str, int]] = set()  # (tokenizer class, length) whose cut captions were warned of


def tokenize(tokenizer, prompts: list[str], max_length: int, **kwargs):
    """``prompts`` padded (or cut) to ``max_length`` tokens, as tensors: how every pipeline's ``encode_prompt``
    tokenizes for its encoders (a prompt's row then does not depend on the prompts beside it). A cut is warned of,
    once per tokenizer and length."""
    tokens = tokenizer(
        prompts, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt", **kwargs
    )
    warned = (type(tokenizer).__name__, max_length)
    if warned not in _CUT_WARNED and "attention_mask" in tokens:
        full = [prompt for prompt, row in zip(prompts, tokens["attention_mask"]) if bool(row.all())]
        lengths = [len(ids) for ids in tokenizer(full, **kwargs)["input_ids"]] if full else []
        cut = [(prompt, length) for prompt, length in zip(full, lengths) if length > max_length]
        if cut:
            _CUT_WARNED.add(warned)
            prompt, length = cut[0]
            logger.warning(
                f"A caption longer than {max_length} tokens is cut to its first {max_length} by "
                f"{type(tokenizer).__name__} ({prompt[:80]!r}: {length} tokens), so the model never reads the rest. "
                "`conditioner.max_length` sets the length where the encoder takes more."
            )
    return tokens


def load_part(cfg: ConditionerConfig, from_pretrained: Callable[..., T], subfolder: str | None, **kwargs) -> T:
    """One part (a tokenizer, an encoder) of ``conditioner.pretrained``, from ``subfolder`` (None: the folder
    itself); a failure names ``conditioner.pretrained`` and says what to do."""
    return load_pretrained(
        from_pretrained,
        cfg.pretrained,
        "conditioner.pretrained",
        subfolder=subfolder or "",
        revision=cfg.revision,
        **kwargs,
    )


def load_encoder(cfg: ConditionerConfig, model_class: type[M], subfolder: str | None, dtype: torch.dtype) -> M:
    """The encoder ``model_class`` from ``subfolder`` of ``conditioner.pretrained``, in ``dtype``. Refused when most
    of its weights are not in the checkpoint: transformers starts those at random with no more than a load report
    (a CLIP folder read as T5 loads nothing), and the run would train on the features of a random network. A few
    missing weights (a head the checkpoint lacks) are named in a warning."""
    model, loading = load_part(cfg, model_class.from_pretrained, subfolder, dtype=dtype, output_loading_info=True)
    missing, total = sorted(loading["missing_keys"]), len(model.state_dict())
    if 2 * len(missing) >= total:
        where = f"`conditioner.pretrained={cfg.pretrained}`" + (f" (subfolder `{subfolder}`)" if subfolder else "")
        saved = pretrained_config(cfg.pretrained, subfolder, cfg.revision) or {}
        holds = saved.get("architectures") or [saved.get("model_type", "another model")]
        raise ModelLoadError(
            f"{where} lacks {len(missing)} of the {total} weights of a {model_class.__name__} (e.g. {missing[0]}): "
            f"its config.json says {holds[0]}, and transformers would start the missing ones at random, so the run "
            "would condition on noise. To fix it, set `conditioner.kind` to the encoder the folder holds (`auto` "
            "reads it from the config.json), or point `conditioner.pretrained` at the model the family's pipeline "
            "uses."
        )
    if missing and os.environ.get("RANK", "0") == "0":
        logger.warning(
            f"{model_class.__name__} from {cfg.pretrained} starts {len(missing)} weights at random, as the checkpoint "
            f"lacks them: {shortlist(missing, 5)}"
        )
    return model


def load_pair(cfg: ConditionerConfig, index: str, model_class, device: torch.device, dtype: torch.dtype):
    """A pipeline's ``tokenizer<index>`` and ``text_encoder<index>`` (``index``: "", "_2", "_3") from the pipeline
    folder ``conditioner.pretrained``, the encoder in ``dtype`` on ``device``."""
    tokenizer = load_part(cfg, AutoTokenizer.from_pretrained, f"tokenizer{index}")
    return tokenizer, load_encoder(cfg, model_class, f"text_encoder{index}", dtype).to(device)


def check_pipeline_folder(conditioner: ConditionerConfig, parts: str, t5_note: str) -> None:
    """A conditioner made of a pipeline's own encoders (``conditioner.kind=sd3|flux``) reads them from the
    pipeline folder's fixed subfolders (``parts``), so it takes no subfolder of its own; and the pipeline encodes
    at most 512 T5 tokens (``t5_note``: what the family's models use)."""
    te = conditioner
    require(
        te.subfolder is None and te.tokenizer_subfolder is None,
        "conditioner.subfolder",
        te.subfolder or te.tokenizer_subfolder,
        f"`conditioner.kind={te.kind}` reads {parts} of the pipeline folder `conditioner.pretrained`",
        f"set `conditioner.subfolder=null conditioner.tokenizer_subfolder=null` (or use `conditioner={te.kind}`) "
        "and point `conditioner.pretrained` at the pipeline folder",
    )
    require(
        te.max_length <= T5_MAX_LENGTH,
        "conditioner.max_length",
        te.max_length,
        f"the pipeline encodes at most {T5_MAX_LENGTH} T5 tokens ({t5_note})",
        f"set `conditioner.max_length={T5_MAX_LENGTH}` or less",
    )
