"""Write what the model sees: items of the training data after decoding, crop, resize and aspect-ratio buckets, with
the captions the data loader gives them. No VAE, text encoder or DiT is built, so it takes seconds.

    python scripts/preview_data.py out_dir=preview/shapes n=16
    python scripts/preview_data.py +experiment=dit data=imagefolder data.path=/data/my_images data.buckets=pixart
        out_dir=preview/my_images [n=64]

Takes train.py's overrides, plus out_dir= (required) and n= (items, default 64). Writes out_dir/00000.png ... at the
size the model trains on, out_dir/index.jsonl with {"file", "caption", "bucket"} per image (bucket: "HxW") and
out_dir/contact_sheet.png; a file of those names already in out_dir is refused (nothing is overwritten). Items of a
random-access source are drawn with trainer.seed across the data set; a stream shows its first items. Captions are
shown before caption dropout, which the training step applies. Exit code 2 for a bad config value.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from dit_trainer.apps.cli import parse_cli, run_train_script
from dit_trainer.apps.preview import preview_data, split_arguments
from dit_trainer.config import PreviewConfig, TrainConfig, call_with_sections

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def preview(own: list[str], cfg: TrainConfig) -> tuple[str, int]:
    """The preview of ``cfg``'s data with the preview's own arguments ``own``."""
    return call_with_sections(preview_data, cfg, args=parse_cli(PreviewConfig, own)).message, 0


def main(argv: list[str]) -> int:
    own, overrides = split_arguments(argv)
    return run_train_script(CONFIG_DIR, overrides, partial(preview, own), __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
