"""Score a trained run: N prompts x G images with the run's configured rewards (shapes: colour/shape accuracy).

    python scripts/evaluate.py outputs/RUN [out_dir=RUN/eval/CHECKPOINT] [images_per_prompt=4] [prompt_file=FILE]
        [seed=0] [steps=..] [guidance_scale=..] [sampler=ddim|dpmsolver++] [checkpoint=latest|best_gold|PATH] [ema=true]
        [weights.clip_score=1.0 weights.jpeg_compressibility=0.05 ...] [clip_model=ID_OR_PATH]
        [metrics=[rewards,fid]] [fid_features=inception|vae] [fid_weights=FILE] [fid_images=N] [fid_cache_dir=DIR]

Prompts default to the run's reward-monitor prompts (shapes: all 24 captions) and rewards to the run's `reward`.
Writes ``report.json`` (reward mean/std per reward function, GRPO group statistics, per-prompt rewards, colour and
shape accuracy for shapes) and ``grid.png`` (one row per prompt, each image captioned with its reward), and prints
the headline numbers. ``metrics=[fid]`` (or ``[rewards,fid]``) adds FID and KID of one sample per validation image
(its caption) against the run's validation images.
"""

from __future__ import annotations

import json
import sys

from dit_trainer.apps.cli import run_cli
from dit_trainer.apps.evaluation import evaluate_to_folder
from dit_trainer.config import EvaluateConfig

HEADLINE = ("reward/mean", "reward/std", "color", "shape", "fid", "kid_mean")


def evaluate(cfg: EvaluateConfig) -> str:
    out_dir, report = evaluate_to_folder(cfg)
    headline = {key: round(report[key], 4) for key in HEADLINE if key in report}
    if "prompts" in report:
        headline["images"] = report["prompts"] * report["images_per_prompt"]
    return json.dumps({**headline, "report": str(out_dir)})


def main(argv: list[str]) -> int:
    return run_cli(evaluate, EvaluateConfig, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
