"""Export a trained run's checkpoint for diffusers (EMA weights by default).

    python scripts/export.py outputs/RUN [out_dir=RUN/export/<checkpoint>] [checkpoint=latest|PATH] [ema=true]
        [sampler=ddim|dpmsolver++] [dtype=float32|bfloat16|float16]

A T5-conditioned run becomes a PixArtAlphaPipeline folder (`PixArtAlphaPipeline.from_pretrained(out_dir)`);
other text encoders get transformer/, vae/, scheduler/ and dit_trainer_export.json, which names the text encoder
and shows how to assemble the pipeline. The VAE's per-channel latent statistics are folded into its weights.
An existing non-empty out_dir is never overwritten; the export is staged beside it and renamed when complete.
"""

from __future__ import annotations

import sys

from dit_trainer.cli import run_cli
from dit_trainer.config import ExportConfig
from dit_trainer.export import export_run


def main(argv: list[str]) -> int:
    return run_cli(lambda cfg: export_run(cfg).message, ExportConfig, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
