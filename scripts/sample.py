r"""Generate images from a trained run (EMA weights by default).

    python scripts/sample.py run_dir=outputs/RUN prompt_file=prompts.txt images_per_prompt=4 out_dir=samples \
        [seed=0] [steps=25] [guidance_scale=3.0] [sampler=ddim|dpmsolver++] \
        [checkpoint=latest|checkpoint-N|PATH] [ema=true]

Writes one PNG per image and ``out_dir/index.jsonl`` with ``{"file", "prompt", "seed"}`` per image; an out_dir that
already holds one of those files is refused (nothing is overwritten).
"""

from __future__ import annotations

import sys

from dit_trainer.apps.cli import run_cli
from dit_trainer.apps.inference import sample_to_folder
from dit_trainer.config import SampleConfig


def main(argv: list[str]) -> int:
    return run_cli(lambda cfg: f"Wrote images and index.jsonl to {sample_to_folder(cfg)}", SampleConfig, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
