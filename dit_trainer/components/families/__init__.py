"""Transformer families: what the trainer needs to know of a diffusers transformer class, behind one interface.

A ``Family`` builds a randomly initialised transformer from ``ModelConfig`` or loads a pretrained one, says whether a
loaded one fits the run's VAE and conditioning, and calls it as ``predict(transformer, x_t, t, embeds, mask)``:
the trainer, the samplers, the monitors, GRPO and export see only that. ``FAMILIES`` is the registry that
``model.family`` names; adding a family is its module, one entry here and a recipe in ``configs/``.
"""

from dit_trainer.components.families.base import Family
from dit_trainer.components.families.dit import DIT
from dit_trainer.components.families.pixart import PIXART_ALPHA, PIXART_SIGMA

FAMILIES: dict[str, Family] = {"pixart_alpha": PIXART_ALPHA, "pixart_sigma": PIXART_SIGMA, "dit": DIT}

__all__ = ["FAMILIES", "Family"]
