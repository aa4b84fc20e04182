"""Export a trained run's checkpoint for diffusers (EMA weights by default).

    python scripts/export.py outputs/RUN [out_dir=RUN/export/<checkpoint>] [checkpoint=latest|checkpoint-N|PATH]
        [ema=true] [sampler=ddim|dpmsolver++] [dtype=float32|bfloat16|float16]
        [push_to_hub=user/name [hub_private=true]]

The folder is the family's diffusers pipeline with the run's text encoder in it (the shapes default: a
PixArtAlphaPipeline holding MiniLM), so `DiffusionPipeline.from_pretrained(out_dir)` loads it from anywhere;
dit_trainer_export.json names the arguments `pipe(prompt)` needs beyond the pipeline's defaults at the trained size
(`required`: at 32 px, PixArt's `use_resolution_binning=False`) and those that reproduce the run's sampler. A LoRA
run's export also holds the adapter alone in lora/, which the base model's `pipe.load_lora_weights` reads (SD3,
Flux, Sana). The VAE's per-channel latent statistics are folded into its weights. Files and folders get the modes
the user's umask gives. An existing non-empty out_dir is never overwritten; the export is staged beside it and
renamed when complete.

Every export holds a model card (README.md: what was trained, how, the sample grid). push_to_hub uploads the
folder to that Hub repository (created private unless hub_private=false); it needs a token (`hf auth login`) and is
refused with HF_HUB_OFFLINE=1, before anything is exported.
"""

from __future__ import annotations

import sys

from dit_trainer.apps.cli import run_cli
from dit_trainer.apps.hub_push import export_and_push
from dit_trainer.config import ExportConfig


def main(argv: list[str]) -> int:
    return run_cli(export_and_push, ExportConfig, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
