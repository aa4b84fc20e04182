"""The trainable DiT behind one call: ``predict(x_t, t, condition) -> prediction`` shaped like ``x_t``."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.utils.checkpoint
from diffusers import ModelMixin
from torch import nn

from dit_trainer.components.families import FAMILIES
from dit_trainer.components.families.base import Family
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ModelConfig
from dit_trainer.errors import ConfigError
from dit_trainer.hub import UNREADABLE_WEIGHTS, load_pretrained, pretrained_config, unreadable_weights

logger = logging.getLogger(__name__)

# The fields that size a new model; a pretrained one brings its own (`model.pretrained`).
ARCHITECTURE_FIELDS = (
    "num_layers",
    "num_attention_heads",
    "attention_head_dim",
    "cross_attention_dim",
    "patch_size",
    "learned_sigma",
    "dropout",
)


class DiTAdapter(nn.Module):
    """Hides the model family's quirks from the training loop and the samplers: ``predict(x_t, t, condition)`` is
    the family's call (``.sample`` vs tuples, a learned-variance half of the outputs, PixArt's micro-conditions,
    class labels, pooled projections, packed latents), with the inputs in the transformer's compute dtype.
    ``forward`` is the same as ``predict`` so that DDP/FSDP wrappers see every call.
    """

    def __init__(self, transformer: ModelMixin, family: Family) -> None:
        super().__init__()
        self.transformer = transformer
        self.family = family

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, condition: Condition) -> torch.Tensor:
        dtype = self.compute_dtype  # class labels and masks stay integers
        prediction = self.family.predict(self.transformer, x_t.to(dtype), t, condition.cast(dtype))
        # PixArt, Sana and DiT slice the channels of ``x_t`` from the output: a view. FSDP2 hooks the root's output for
        # its backward (and warns of a view), and an in-place op on a view would drop that hook: this one owns its data.
        return prediction if prediction._base is None else prediction.clone()

    predict = forward

    def guide(self, cond: torch.Tensor, uncond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
        """Classifier-free guidance as the family's pipeline combines the two predictions (``Family.guide``)."""
        return self.family.guide(cond, uncond, guidance_scale)

    def blocks(self) -> list[nn.Module]:
        """The transformer's repeated blocks, in order, from the ModuleLists its family names (``Family.blocks``):
        what ``trainer.compile`` compiles, FSDP wraps and the memory estimate checkpoints. None for a model without
        them (a family from outside the package that keeps the default names)."""
        lists = [getattr(self.transformer, name, None) for name in self.family.blocks]
        return [block for blocks in lists if isinstance(blocks, nn.ModuleList) for block in blocks]

    def freeze_dead_ends(self) -> None:
        """Freeze the family's ``dead_ends`` (see ``Family``), with any adapter LoRA put in them."""
        for path in self.family.dead_ends(self.transformer) if self.family.dead_ends is not None else ():
            self.transformer.get_submodule(path).requires_grad_(False)

    def shared_modules(self) -> list[nn.Module]:
        """The modules that run outside the block holding them (``Family.shared``): FSDP's units of their own."""
        return [self.transformer.get_submodule(path) for path in self.family.shared]

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype the inputs are cast to: that of the patch embedding, the first layer they meet. (diffusers'
        ``ModelMixin.dtype`` walks every submodule looking for casting hooks on each call, twice a forward.)"""
        return self.transformer.get_submodule(self.family.input_layer).weight.dtype


def load_transformer(cfg: ModelConfig) -> ModelMixin:
    """The pretrained transformer ``model.pretrained`` names (hub id or local path), of the class of
    ``model.family``. A hub model may ship only a pickled ``.bin``; diffusers reads that with
    ``torch.load(weights_only=True)``, safe from torch 2.6 on."""
    return load_pretrained(
        FAMILIES.get(cfg.family).transformer_class.from_pretrained,
        cfg.pretrained,
        "model.pretrained",
        subfolder=cfg.subfolder,
        revision=cfg.revision,
    )


def known_patch_size(cfg: ModelConfig) -> int | None:
    """The DiT's patch size (latents per token side, the family's packing included) before it is built: configured,
    or from a pretrained DiT's config.json when that is on this machine; None until it downloads (``build_dit``
    checks the latent size against it then)."""
    if not cfg.pretrained:
        return cfg.patch_size
    config = pretrained_config(cfg.pretrained, cfg.subfolder, cfg.revision)
    return None if config is None else FAMILIES.get(cfg.family).latents_per_token(config)


def load_trained_transformer(folder: Path, transformer_class: type[ModelMixin]) -> ModelMixin:
    """The transformer in one of our own checkpoint folders, read from safetensors only: dit-trainer never writes a
    pickle there, so a ``.bin`` beside or instead of the weights was planted, and is not unpickled. Damaged files
    are a ``ModelLoadError`` naming the folder."""
    try:
        return transformer_class.from_pretrained(folder, use_safetensors=True)
    except UNREADABLE_WEIGHTS as error:
        raise unreadable_weights(folder, error) from error


def enable_gradient_checkpointing(dit: DiTAdapter, reentrant: bool = False, every: int = 1) -> None:
    """Recompute transformer blocks in backward: every ``every``-th one (1: all; 2: blocks 0, 2, 4, ...: selective
    checkpointing, half the recomputation for about half the savings). ``reentrant`` picks torch's
    ``use_reentrant=True`` variant, which gives no gradient to a block whose inputs do not require grad (LoRA on a
    frozen patch embedding)."""
    position = {id(block): index for index, block in enumerate(dit.blocks())}

    def checkpoint(block: nn.Module, *args):
        index = position.get(id(block))  # a block the family does not list: recomputed only when all are
        if (index is None and every > 1) or (index is not None and index % every):
            return block(*args)
        return torch.utils.checkpoint.checkpoint(block.__call__, *args, use_reentrant=reentrant)

    dit.transformer.enable_gradient_checkpointing(checkpoint)


def refuse_misfit(family: Family, config: Mapping, source: str, in_channels: int, condition: ConditionSize) -> None:
    """A transformer config (``source``: where it is) that does not take the VAE's latents or the conditioner's
    features is a ``ConfigError`` naming ``model.pretrained``."""
    problem = family.mismatch(config, in_channels, condition)
    if problem:
        raise ConfigError(
            "model.pretrained",
            source,
            problem,
            "point `model.pretrained` at a transformer that fits this run, or use the VAE and the conditioner it was "
            "trained with (`vae=...`, `conditioner=...`)",
        )


def load_fitting_transformer(
    cfg: ModelConfig, family: Family, in_channels: int, condition: ConditionSize, weights: Path | None
) -> ModelMixin:
    """``model.pretrained`` (or, with ``weights``, a checkpoint's transformer folder), refused if it does not fit
    the run: from its config.json when that is on this machine, before its weights load (a 6 B-parameter model
    takes minutes), else once loaded."""
    source = str(weights or cfg.pretrained)
    where = (str(weights), None, None) if weights is not None else (cfg.pretrained, cfg.subfolder, cfg.revision)
    config = pretrained_config(*where)
    if config is not None and config.get("_class_name") == family.transformer_class.__name__:
        refuse_misfit(family, config, source, in_channels, condition)
    transformer = (
        load_transformer(cfg) if weights is None else load_trained_transformer(weights, family.transformer_class)
    )
    refuse_misfit(family, transformer.config, source, in_channels, condition)
    if weights is None:
        warn_ignored_architecture(cfg, transformer.config)
    return transformer


def ignored_architecture(cfg: ModelConfig, config: Mapping) -> dict[str, object]:
    """The architecture settings (``model.<field>`` or ``model.extra_config.<key>``: value) set away from their
    defaults that the pretrained transformer's ``config`` does not hold: a user who sets ``model.num_layers=12``
    beside ``model.pretrained`` may think the model is cut to 12 blocks. A field its config names otherwise counts
    whenever it is set."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    ignored: dict[str, object] = {}
    for name in ARCHITECTURE_FIELDS:
        value = getattr(cfg, name)
        if value == defaults[name] or (name in config and config[name] == value):
            continue
        if name == "learned_sigma" and (config.get("out_channels") == 2 * config.get("in_channels", -1)) == value:
            continue  # the model has a variance half as asked
        ignored[f"model.{name}"] = value
    ignored |= {
        f"model.extra_config.{key}": value for key, value in cfg.extra_config.items() if config.get(key) != value
    }
    return ignored


def warn_ignored_architecture(cfg: ModelConfig, config: Mapping) -> None:
    """Warn of the sizes set in ``model.*`` that the transformer ``model.pretrained`` loaded does not have."""
    ignored = ignored_architecture(cfg, config)
    if not ignored:
        return
    held = {key: config[key.rsplit(".", 1)[-1]] for key in ignored if key.rsplit(".", 1)[-1] in config}
    named = ", ".join(
        f"`{key}={value}`" + (f" (it has {held[key]})" if key in held else "") for key, value in ignored.items()
    )
    logger.warning(
        f"{named} {'is' if len(ignored) == 1 else 'are'} not used: `model.pretrained={cfg.pretrained}` brings its "
        "own architecture (its config.json), and the run trains that. Drop these settings, or leave "
        "`model.pretrained` unset to build a new model of these sizes."
    )


def build_dit(
    cfg: ModelConfig, in_channels: int, sample_size: int, condition_size: ConditionSize, weights: Path | None = None
) -> DiTAdapter:
    """A transformer of ``model.family`` sized by ``cfg`` whose input follows the VAE (``in_channels``,
    ``sample_size``) and whose conditioning inputs follow the conditioner (``condition_size``); with ``weights`` (a
    checkpoint's transformer folder), the one trained there."""
    family = FAMILIES.get(cfg.family)
    if weights is not None or cfg.pretrained:
        transformer = load_fitting_transformer(cfg, family, in_channels, condition_size, weights)
    else:
        transformer = family.build(cfg, in_channels, sample_size, condition_size)
    if family.prepare is not None:
        family.prepare(transformer)
    if family.configure is not None:
        family.configure(transformer, cfg)
    patch = family.patch_size_of(transformer.config)  # a misfit without one was refused above
    if sample_size % patch:
        raise ConfigError(
            "model.patch_size",
            patch,
            f"the latent size {sample_size} must be divisible by it",
            "pick a patch size that divides the latent size, or change `data.resolution`",
        )
    return DiTAdapter(transformer.train(), family)
