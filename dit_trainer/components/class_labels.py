"""Class labels as the condition (``text_encoder.kind=class_labels``): the class-conditional DiT's "text encoder".

It has the text encoder's call, ``encode(prompts) -> (labels, mask)``, so the data, caption dropout, CFG, the
samplers, the monitors and GRPO work unchanged: a prompt is a class name (or its id), the empty prompt is the null
class (id ``num_classes``, the row DiT's label table keeps for classifier-free guidance), and caption dropout is
label dropout.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from dit_trainer.errors import ConfigError

CLASS_LABELS = "class_labels"  # the text_encoder.kind that selects it


class ClassLabels(nn.Module):
    """``encode(prompts) -> (labels (B,) int64, mask (B, 1))`` for the classes ``names`` (id = position). A module
    without parameters, so that the tools that inspect a run's components (the gradient doctor, the parameter
    table) see it as they see a frozen text encoder."""

    def __init__(self, names: Sequence[str], device: torch.device) -> None:
        super().__init__()
        self.names = list(names)
        self.ids = {name: index for index, name in enumerate(self.names)}
        self.device = device

    @property
    def hidden_size(self) -> int:
        """The number of classes: what sizes the DiT's label table (the conditioning input's "width")."""
        return len(self.names)

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

    def encode(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.tensor([self.class_id(prompt) for prompt in prompts], dtype=torch.long, device=self.device)
        return labels, torch.ones(len(labels), 1, dtype=torch.long, device=self.device)


def class_folders(path: str | Path) -> list[str]:
    """The sub-folder names of ``path``, sorted: the classes of a torchvision-style ``ImageFolder``."""
    return sorted(entry.name for entry in Path(path).expanduser().iterdir() if entry.is_dir())
