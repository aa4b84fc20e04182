"""Colour and shape accuracy of a shapes run: 4 samples per caption (96 images), fixed seeds.

python scripts/evaluate.py run_dir=outputs/RUN [checkpoint=latest] [images_per_caption=4] [steps=..]
    [guidance_scale=..] [ema=true]
"""

from __future__ import annotations

import json
import sys

from omegaconf import OmegaConf

from dit_trainer.config import register_configs
from dit_trainer.evaluation import shapes_accuracy
from dit_trainer.inference import load_run


def main(argv: list[str]) -> int:
    register_configs()
    args = OmegaConf.from_dotlist(argv)
    run = load_run(args.run_dir, args.get("checkpoint", "latest"), args.get("ema", True))
    result = shapes_accuracy(
        run, args.get("images_per_caption", 4), args.get("seed", 0), args.get("steps"), args.get("guidance_scale")
    )
    print(json.dumps({"run_dir": str(args.run_dir), "checkpoint": str(run.checkpoint), **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
