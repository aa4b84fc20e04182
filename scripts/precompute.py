"""Encode a data set once with the frozen VAE and text encoder; training then reads the cache instead.

    python scripts/precompute.py +experiment=dit data.path=/data/my_images data.cache_dir=/scratch/cache/my_images
    accelerate launch --multi_gpu --num_processes 8 scripts/precompute.py ...     # the ranks split the data set
    python train.py +experiment=dit data.path=/data/my_images data.cache_dir=/scratch/cache/my_images

Takes train.py's overrides: the cache is made for exactly that config, and training refuses a cache whose VAE,
text encoder, resolution, crop, max_length, dtype, data source or data differ. Run it again after changing the sample
or monitor prompts: an existing cache only gets the prompts it lacks. data.cache_dir must be a new or empty folder (or
the cache itself). Exit code 2 for a bad config value.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dit_trainer.apps.cli import run_train_script
from dit_trainer.apps.precompute import precompute
from dit_trainer.config import TrainConfig, call_with_sections

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def write_cache(cfg: TrainConfig) -> tuple[str, int]:
    return call_with_sections(precompute, cfg).message, 0


if __name__ == "__main__":
    sys.exit(run_train_script(CONFIG_DIR, sys.argv[1:], write_cache, __doc__))
