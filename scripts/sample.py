"""Generate images from a trained run (EMA weights by default).

    python scripts/sample.py run_dir=outputs/RUN prompt_file=prompts.txt images_per_prompt=4 out_dir=samples \
        [seed=0] [steps=25] [guidance_scale=3.0] [checkpoint=latest|PATH] [ema=true]

Writes one PNG per image and ``out_dir/index.jsonl`` with ``{"file", "prompt", "seed"}`` per image.
"""

from __future__ import annotations

import sys

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dit_trainer.config import ConfigError, SampleConfig, register_configs
from dit_trainer.hub import ModelLoadError
from dit_trainer.inference import sample_to_folder


def main(argv: list[str]) -> int:
    register_configs()
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SampleConfig), OmegaConf.from_dotlist(argv)))
        out_dir = sample_to_folder(cfg)
    except (ConfigError, ModelLoadError, OmegaConfBaseException) as error:
        print(f"error: {error}\n\n{__doc__}", file=sys.stderr)
        return 2
    print(f"Wrote images and index.jsonl to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
