"""Caption tools, as kohya, ai-toolkit and OneTrainer users know them: a trigger word or phrase before every caption
(``data.caption_prefix``), tag shuffling with the first tags kept in place (``data.shuffle_tags``,
``data.keep_tags``) and tag dropout (``data.tag_dropout``). A caption's tags are its comma-separated parts.

The prefix is fixed, so it is put on where the file sources read a caption (``transforms.pick_caption``): the
caches, the held-out validation captions and FID's prompts carry it too. Shuffling and dropout are drawn anew every
time a caption is trained on, so they happen in the training step (``diffusion.loss.batch_condition``), where the
captions of every source arrive, the in-memory latent cache's included; there the prefix, the first tag, stays in
place. A disk cache (``data.cache_dir``) holds one text embedding per image, which would freeze one draw for the whole
run: that combination is refused (``check_caption_tools``).

The draws come from a CPU generator keyed by the state of the step's generator, read and not advanced: a resumed run
draws exactly what the uninterrupted one did, each micro-batch and process draws differently, no GPU sync is needed,
and the noise and timesteps of a step are the same with the tools on or off.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from dit_trainer.config import ConditionerConfig, DataConfig
from dit_trainer.config.choices import CLASS_LABELS
from dit_trainer.data import SOURCES, configured_sources
from dit_trainer.errors import require

SEPARATOR = ", "


def with_prefix(caption: str, prefix: str) -> str:
    """``caption`` with ``prefix`` as its first tag (the prefix alone for an empty caption)."""
    if not prefix:
        return caption
    return f"{prefix}{SEPARATOR}{caption}" if caption else prefix


def tags_of(caption: str) -> list[str]:
    """The non-empty comma-separated parts of ``caption``, stripped."""
    return [tag for tag in (part.strip() for part in caption.split(",")) if tag]


def draws_for(generator: torch.Generator) -> torch.Generator:
    """A CPU generator seeded by ``generator``'s current state, which is read, not advanced (see the module's
    docstring)."""
    digest = hashlib.blake2b(generator.get_state().numpy().tobytes(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


@dataclass(frozen=True)
class TagAugmentation:
    """Each step's tag shuffling and dropout (``data.shuffle_tags``, ``data.keep_tags``, ``data.tag_dropout``); the
    first ``keep`` tags after the ``prefix`` stay as they are."""

    prefix: str = ""
    shuffle: bool = False
    keep: int = 0
    dropout: float = 0.0

    def __call__(self, captions: list[str], generator: torch.Generator) -> list[str]:
        draws = draws_for(generator)
        return [self.one(caption, draws) for caption in captions]

    def one(self, caption: str, draws: torch.Generator) -> str:
        prefixed = self.prefix and (caption == self.prefix or caption.startswith(self.prefix + SEPARATOR))
        head = self.prefix if prefixed else ""
        tags = tags_of(caption[len(head) :])
        kept, rest = tags[: self.keep], tags[self.keep :]
        if self.shuffle and len(rest) > 1:
            rest = [rest[i] for i in torch.randperm(len(rest), generator=draws).tolist()]
        if self.dropout and rest:
            rest = [tag for tag, u in zip(rest, torch.rand(len(rest), generator=draws).tolist()) if u >= self.dropout]
        return with_prefix(SEPARATOR.join(kept + rest), head)


def tag_augmentation(data: DataConfig) -> TagAugmentation | None:
    """The configured tag shuffling and dropout; None when neither is on (captions are then passed as they are)."""
    if not data.shuffle_tags and not data.tag_dropout:
        return None
    return TagAugmentation(data.caption_prefix, data.shuffle_tags, data.keep_tags, data.tag_dropout)


def check_caption_tools(conditioner: ConditionerConfig, data: DataConfig) -> None:
    """Caption tools need captions that are text: not class names (``conditioner.kind=class_labels`` looks each up
    by name), not a disk cache's embeddings for the per-step draws, and, for the prefix, a source that puts it on."""
    settings = {
        "shuffle_tags": data.shuffle_tags,
        "tag_dropout": data.tag_dropout,
        "caption_prefix": data.caption_prefix,
    }
    used = [name for name, value in settings.items() if value]
    if not used:
        return
    key, value = f"data.{used[0]}", settings[used[0]]
    drawn = used[0] != "caption_prefix"
    require(
        conditioner.kind != CLASS_LABELS,
        key,
        value,
        "`conditioner.kind=class_labels` looks every caption up as a class name, which a prefix or a changed tag "
        "list would no longer be",
        f"set `{key}` back to its default for a class-conditional run",
    )
    if drawn:
        require(
            not data.cache_dir,
            key,
            value,
            "`data.cache_dir` trains from text embeddings encoded once by scripts/precompute.py, one per image, so "
            "a tag order or tag dropout drawn there would be frozen for the whole run instead of drawn anew each "
            "time the caption is trained on",
            "train without `data.cache_dir` (`data.cache_latents=true` still encodes each image once and keeps the "
            "captions as text, so their tags are drawn every step), or set `data.shuffle_tags=false "
            "data.tag_dropout=0`",
        )
    if data.caption_prefix:
        sources = configured_sources(data)
        other = next((name for name in sources if not SOURCES.get(name).caption_prefix), None)
        require(
            other is None,
            "data.caption_prefix",
            data.caption_prefix,
            f"`{other}` makes its own captions and puts no prefix before them (the file sources imagefolder, hf "
            "and webdataset do)",
            "train on a folder or data set of images with captions, or set `data.caption_prefix=''`",
        )
