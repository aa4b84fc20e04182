"""Class labels as the condition (``conditioner.kind=class_labels``): the class-conditional DiT's "text encoder".

It has the text encoder's call, ``encode(prompts) -> Condition`` (the labels as its sequence), so the data, caption
dropout, CFG, the samplers, the monitors and GRPO work unchanged: a prompt is a class name (or its id), the empty
prompt is the null class (id ``num_classes``, the row DiT's label table keeps for classifier-free guidance), and
caption dropout is label dropout.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from dit_trainer.components.kinds import ConditionerKind
from dit_trainer.condition import Condition, ConditionSize
from dit_trainer.config import ConditionerConfig, DataConfig, MonitorConfig, TrainerConfig
from dit_trainer.errors import ConfigError, require
from dit_trainer.prompts import load_prompts


class ClassLabels(nn.Module):
    """``encode(prompts) -> Condition(labels (B,) int64, mask (B, 1))`` for the classes ``names`` (id = position).
    A module without parameters, so that the tools that inspect a run's components (the gradient doctor, the parameter
    table) see it as they see a frozen text encoder."""

    def __init__(self, names: Sequence[str], device: torch.device) -> None:
        super().__init__()
        self.names = list(names)
        self.ids = {name: index for index, name in enumerate(self.names)}
        self.device = device

    @property
    def size(self) -> ConditionSize:
        """The number of classes: what sizes the DiT's label table (the conditioning input's "width")."""
        return ConditionSize(len(self.names))

    @property
    def null_class(self) -> int:
        return len(self.names)

    def class_id(self, prompt: str) -> int:
        """A class name's id; a whole number that is not a name is read as an id; "" is the null class."""
        if prompt == "":
            return self.null_class
        if prompt in self.ids:
            return self.ids[prompt]
        if prompt.isdigit() and int(prompt) < len(self.names):
            return int(prompt)
        shown = ", ".join(self.names[:10]) + (", ..." if len(self.names) > 10 else "")
        raise ConfigError(
            "prompts",
            prompt,
            f"a class-conditional run knows the classes {shown} (ids 0-{len(self.names) - 1})",
            "give class names or ids as prompts (one per line in a prompt file)",
        )

    def check_prompts(self, prompts: Sequence[str]) -> None:
        """Refuse a prompt that names no class, before anything is generated or written."""
        for prompt in dict.fromkeys(prompts):
            self.class_id(prompt)

    def encode(self, prompts: Sequence[str]) -> Condition:
        """Ids made on the host and copied without waiting: ``torch.tensor(..., device=cuda)`` would block until the
        GPU has run everything queued before it, every step."""
        ids = torch.tensor([self.class_id(prompt) for prompt in prompts], dtype=torch.long)
        labels = ids.to(self.device, non_blocking=True)
        return Condition(labels, torch.ones(len(labels), 1, dtype=torch.long, device=self.device))


def check_class_labels(
    conditioner: ConditionerConfig, data: DataConfig, trainer: TrainerConfig, monitor: MonitorConfig
) -> None:
    """Class labels need their names, and the prompts a run samples must be among them."""
    folder = Path(data.path).expanduser() if data.path and not data.mixture else None
    require(
        bool(conditioner.classes) or folder is None or folder.is_dir(),
        "data.path",
        data.path,
        "there is no folder there to read the class names from (its class sub-folders)",
        "point `data.path` at the folder of class sub-folders (a relative path is read from where train.py runs)",
    )
    require(
        bool(conditioner.classes),
        "conditioner.classes",
        conditioner.classes,
        "class labels need the class names, and `data.path` is not a folder of class sub-folders to read them from",
        "list them (`conditioner.classes=[cat,dog]`, ids in that order) or train on class sub-folders",
    )
    require(
        not data.cache_dir,
        "data.cache_dir",
        data.cache_dir,
        "a disk cache of class-conditional data is not supported yet",
        "cache in memory instead (`data.cache_latents=true`)",
    )
    for key, prompts in _sampled_prompts(trainer, monitor):
        check_prompts_are_classes(conditioner, key, prompts)


def check_prompts_are_classes(text: ConditionerConfig, key: str, prompts: list[str]) -> None:
    """Refuse ``prompts`` (set by ``key``) that are neither class names nor ids: a method that samples prompts of
    its own asks this of them too (found otherwise only once the models are loaded)."""
    ids = {str(index) for index in range(len(text.classes))}
    unknown = [prompt for prompt in prompts if prompt not in text.classes and prompt not in ids]
    require(
        not unknown,
        key,
        unknown[:3],
        f"a class-conditional run samples class names or ids, and these are neither (classes: "
        f"{', '.join(text.classes[:10])}{', ...' if len(text.classes) > 10 else ''})",
        "list class names or ids in that file, one per line"
        if key.endswith("prompt_file")
        else f"sample class names or ids, e.g. `{key}=[0,1,2]`",
    )


def _sampled_prompts(trainer: TrainerConfig, monitor: MonitorConfig) -> list[tuple[str, list[str]]]:
    """Every set of prompts the run samples for its reports, by the key that sets it: the sample grid's and the
    reward monitor's."""
    found = [("trainer.sample_prompts", list(trainer.sample_prompts))]
    reward = monitor.reward
    if reward.enabled:
        key = "monitor.reward.prompt_file" if reward.prompt_file else "monitor.reward.prompts"
        found.append((key, load_prompts(reward.prompts, reward.prompt_file, "monitor.reward.")))
    return found


def _build(cfg: ConditionerConfig, device: torch.device, dtype: torch.dtype) -> ClassLabels:
    return ClassLabels(cfg.classes, device)


CLASS_LABELS_ENCODER = ConditionerKind(_build, condition="class", check=check_class_labels, pretrained=False)
