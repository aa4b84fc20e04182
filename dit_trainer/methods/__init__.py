"""Training methods: how the DiT is trained (``trainer.method``), each behind one interface (``base.Method``).

A method says what its run reads (a data set, or its own samples), checks and describes its own config section,
and builds the step the ``Trainer`` runs (``training.step.TrainingStep``); the composition root, the checks and the
reports ask it, and never name it. ``METHODS`` is the registry ``trainer.method`` names; adding a method is its
module (or folder), one entry here and a recipe in ``configs/`` (or, outside this package,
``trainer.method=package.module:METHOD``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_trainer.registry import Registry

if TYPE_CHECKING:
    from dit_trainer.config import TrainerConfig
    from dit_trainer.methods.base import Method

METHODS: Registry[Method] = Registry(
    "trainer.method",
    {
        "sft": "dit_trainer.methods.sft:SFT",
        "grpo": "dit_trainer.grpo.method:GRPO",
        "nft": "dit_trainer.nft.method:NFT",
    },
    kind="dit_trainer.methods.base:Method",
)


def method_of(trainer: TrainerConfig) -> Method:
    """The method ``trainer.method`` names (imported on first use)."""
    return METHODS.get(trainer.method)
