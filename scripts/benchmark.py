"""Measure the trainer against the bare model step and a diffusers-style reference loop, in one process.

    python scripts/benchmark.py +experiment=shapes
    python scripts/benchmark.py --steps 50 --out outputs/bench/dit +experiment=dit data.path=/data/my_images

Options before the train.py overrides: --steps (timed steps per measurement, default 20), --warmup (default 5),
--out (the benchmark's folder, default outputs/benchmark/<date>/<time>). Prints a table and writes
OUT/benchmark.json; the cache it trains from is written to OUT/cache unless data.cache_dir names one.

    python scripts/benchmark.py --loader --workers 0 1 2 +experiment=shapes data=imagefolder data.path=/data/images

--loader measures the data loader instead (images/s at each --workers count, over --steps batches) against the
trainer's step encoding every batch, and writes OUT/loader.json.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

from dit_trainer.apps.benchmark import format_loader_table, format_table, run_benchmark, run_loader_benchmark
from dit_trainer.apps.cli import run_train_script
from dit_trainer.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=REPO / "outputs" / "benchmark" / f"{datetime.now():%Y-%m-%d/%H-%M-%S}"
    )
    parser.add_argument("--loader", action="store_true", help="measure the data loader against the trainer's step")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    options, overrides = parser.parse_known_args(argv)

    def benchmark(cfg: TrainConfig) -> tuple[str, int]:
        if options.loader:
            report = run_loader_benchmark(cfg, options.out, options.workers, options.steps, options.steps)
            return f"{format_loader_table(report)}\nWrote {options.out / 'loader.json'}", 0
        report = run_benchmark(cfg, options.out, options.warmup, options.steps)
        return f"{format_table(report)}\nWrote {options.out / 'benchmark.json'}", 0

    return run_train_script(REPO / "configs", overrides, benchmark, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
