"""Transformer families: what the trainer needs to know of a diffusers transformer class, behind one interface
(``base.Family``).

A ``Family`` builds a randomly initialised transformer from ``ModelConfig`` or loads a pretrained one, says whether a
loaded one fits the run's VAE and conditioning, checks its own config rules, and calls it as
``predict(transformer, x_t, t, condition)``; it also names its LoRA targets, prepares itself for DP and writes
its diffusers pipeline on export. The trainer, the samplers, the monitors, GRPO and export see only that.
``FAMILIES`` is the registry ``model.family`` names; adding a family is its module, one entry here and a recipe in
``configs/`` (or, outside this package, ``model.family=package.module:FAMILY``).
"""

from dit_trainer.registry import Registry

FAMILIES = Registry(
    "model.family",
    {
        "pixart_alpha": "dit_trainer.components.families.pixart:PIXART_ALPHA",
        "pixart_sigma": "dit_trainer.components.families.pixart:PIXART_SIGMA",
        "dit": "dit_trainer.components.families.dit:DIT",
        "sd3": "dit_trainer.components.families.sd3:SD3",
        "flux": "dit_trainer.components.families.flux:FLUX",
        "sana": "dit_trainer.components.families.sana:SANA",
        "z_image": "dit_trainer.components.families.z_image:Z_IMAGE",
        "qwen_image": "dit_trainer.components.families.qwen_image:QWEN_IMAGE",
        "flux2": "dit_trainer.components.families.flux2:FLUX2",
        "wan": "dit_trainer.components.families.wan:WAN",
    },
    kind="dit_trainer.components.families.base:Family",
)
