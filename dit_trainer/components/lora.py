"""LoRA fine-tuning with peft: adapters injected into the DiT in place, the base frozen.

Adapters are saved in peft's own format (``adapter_config.json`` + ``adapter_model.safetensors``), so a checkpoint
holds only what trains and ``peft`` users can load it onto the same base model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from diffusers import ModelMixin
from peft import LoraConfig, get_peft_model_state_dict, set_peft_model_state_dict
from peft.tuners.lora import LoraModel
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import ModulesToSaveWrapper
from safetensors.torch import load_file, save_file

from dit_trainer.config import LoRAConfig, ModelConfig
from dit_trainer.errors import ConfigError
from dit_trainer.hub import UNREADABLE_WEIGHTS, unreadable_weights, weights_fingerprint

ADAPTER_NAME = "default"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def base_weights(model: ModelConfig, lora: LoRAConfig) -> str | None:
    """The fingerprint of the frozen base a LoRA run's adapters train on (``hub.weights_fingerprint``; None: a full
    fine-tune, a new model, or a hub model not downloaded yet): adapters mean something only on their base."""
    if not (lora.enabled and model.pretrained):
        return None
    return weights_fingerprint(model.pretrained, model.subfolder, model.revision)


def changed_base(recorded: str | None, found: str | None) -> bool:
    """Whether the base a LoRA checkpoint recorded (``base_weights`` in its manifest) is not the one found now. One not
    recorded, or a base not on this machine, is not compared."""
    return recorded is not None and found is not None and recorded != found


def peft_config(cfg: LoRAConfig, default_targets: Sequence[str] = ()) -> LoraConfig:
    return LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules or default_targets),
        modules_to_save=list(cfg.train_modules) or None,
    )


def apply_lora(transformer: ModelMixin, cfg: LoRAConfig, default_targets: Sequence[str] = ()) -> LoraModel:
    """Freeze ``transformer`` and inject adapters into it in place (into ``lora.target_modules``, or when that is
    empty the family's ``default_targets``); returns peft's tuner, which can merge them."""
    transformer.requires_grad_(False)
    try:
        tuner = LoraModel(transformer, peft_config(cfg, default_targets), ADAPTER_NAME)
    except ValueError as error:  # peft: "Target modules {...} not found in the base model"
        raise ConfigError(
            "lora.target_modules",
            list(cfg.target_modules or default_targets),
            f"peft could not adapt them ({str(error).splitlines()[0]})",
            "name the DiT's Linear layers by suffix, e.g. `lora.target_modules=[to_q,to_k,to_v,to_out.0]`",
        ) from error
    _check_train_modules(transformer, cfg.train_modules)
    return tuner


def _check_train_modules(transformer: ModelMixin, names: Sequence[str]) -> None:
    """Each of ``lora.train_modules`` must have wrapped a module: peft passes over a name that matches none (a typo
    would train nothing of it, silently)."""
    wrapped = [name for name, module in transformer.named_modules() if isinstance(module, ModulesToSaveWrapper)]
    missing = [name for name in names if not any(path.endswith(name) for path in wrapped)]
    if missing:
        children = ", ".join(name for name, _ in transformer.named_children())
        raise ConfigError(
            "lora.train_modules",
            list(names),
            f"no module of the DiT is named {', '.join(map(repr, missing))} (by suffix); its top-level modules "
            f"are {children}",
            "name modules of the DiT to train in full beside the adapters, e.g. `lora.train_modules=[proj_out]`, "
            "or leave it empty",
        )


def save_adapter(transformer: ModelMixin, directory: Path, whole_state: dict[str, torch.Tensor] | None = None) -> None:
    """The adapter (and ``train_modules``) weights of ``transformer`` in peft's format, read from ``whole_state``
    (the gathered state dict of a sharded model) when given."""
    directory.mkdir(parents=True, exist_ok=True)
    transformer.peft_config[ADAPTER_NAME].save_pretrained(str(directory))
    state = get_peft_model_state_dict(transformer, state_dict=whole_state, adapter_name=ADAPTER_NAME)
    save_file({name: tensor.detach().contiguous() for name, tensor in state.items()}, directory / ADAPTER_WEIGHTS)


def load_adapter(transformer: ModelMixin, directory: Path) -> None:
    """Load adapter weights saved by ``save_adapter`` into a transformer that ``apply_lora`` prepared."""
    try:
        weights = load_file(directory / ADAPTER_WEIGHTS)
    except UNREADABLE_WEIGHTS as error:
        raise unreadable_weights(directory, error) from error
    result = set_peft_model_state_dict(transformer, weights, adapter_name=ADAPTER_NAME)
    if result.unexpected_keys:
        raise ConfigError(
            "lora",
            str(directory),
            f"its adapter does not fit this model (unexpected weights such as {result.unexpected_keys[0]})",
            "use the run's own config (rank, target_modules, train_modules) and base model",
        )


def merge_adapter(
    base: ModelMixin, cfg: LoRAConfig, directory: Path, default_targets: Sequence[str] = ()
) -> ModelMixin:
    """``base`` with the adapter in ``directory`` merged into its weights: a plain diffusers transformer."""
    tuner = apply_lora(base, cfg, default_targets)
    load_adapter(base, directory)
    return tuner.merge_and_unload()


@contextlib.contextmanager
def adapters_disabled(transformer: ModelMixin) -> Iterator[None]:
    """``transformer`` computes as its base model inside (peft's switch): the adapters off, and the modules trained
    in full (``lora.train_modules``, which peft wraps with the base's copy) back on the base's copy. peft's switch
    also clears the adapters' ``requires_grad`` and sets them all on when re-enabling: each is given back what it
    had, so an adapter frozen on purpose (a family's dead end) stays frozen."""
    switched = (BaseTunerLayer, ModulesToSaveWrapper)
    layers = [module for module in transformer.modules() if isinstance(module, switched)]
    trained = {parameter: parameter.requires_grad for parameter in transformer.parameters()}
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for parameter, requires_grad in trained.items():
            parameter.requires_grad_(requires_grad)
