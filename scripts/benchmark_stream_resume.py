"""How long a streamed run waits for its first batch when it resumes at step 10 and at step 2,000: with the stream
position a checkpoint saves (``data/stream_loader.py``) and, as before it, reading and dropping every batch since
step 0 (still the fallback for checkpoints without a position). One process, on a synthetic webdataset.

    python scripts/benchmark_stream_resume.py [--images 20000] [--shards 20] [--batch 32] [--workers 2]

Each measurement builds a fresh loader (workers started as a run starts them) and times it to its first batch;
the trainer's own start-up (models, accelerate) comes on top of both equally. Prints a table; --out writes JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import webdataset
from accelerate import PartialState
from PIL import Image

from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.webdataset import WebDatasetSource
from dit_trainer.data.stream_loader import StreamLoader
from dit_trainer.training.batches import resumable_batches


def write_shards(folder: Path, images: int, shards: int) -> str:
    """``images`` 16x16 noise PNGs with captions in ``shards`` tar shards; returns the brace pattern."""
    rng = np.random.default_rng(0)
    for shard in range(shards):
        with webdataset.TarWriter(str(folder / f"{shard:06d}.tar")) as writer:
            for i in range(shard, images, shards):
                buffer = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(buffer, "PNG")
                writer.write({"__key__": f"{i:08d}", "png": buffer.getvalue(), "txt": f"image {i}"})
    return str(folder / f"{{000000..{shards - 1:06d}}}.tar")


def loader(pattern: str, batch: int, workers: int) -> StreamLoader:
    source = WebDatasetSource(pattern, 16, "txt", shuffle_buffer=1000, rank=0, world_size=1)
    return StreamLoader(source, batch_size=batch, drop_last=True, collate_fn=collate_batch, num_workers=workers)


def position_at(pattern: str, step: int, batch: int, workers: int) -> dict:
    """The stream position a checkpoint at ``step`` saves (reached by reading ``step`` batches once)."""
    stream = loader(pattern, batch, workers)
    batches = resumable_batches(stream, None, 0)
    for _ in range(step):
        next(batches)
    return stream.state_dict()


def seconds_to_first_batch(pattern: str, step: int, batch: int, workers: int, position: dict | None) -> float:
    start = time.perf_counter()
    stream = loader(pattern, batch, workers)
    if position is not None:
        stream.load_state_dict(position)
    next(resumable_batches(stream, None, step))
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 2000])
    parser.add_argument("--out", type=Path)
    options = parser.parse_args(argv)
    PartialState(cpu=True)  # what the trainer's logging (the read-and-drop warning) runs under
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        pattern = write_shards(Path(folder), options.images, options.shards)
        print(f"wrote {options.images} images in {options.shards} shards in {time.perf_counter() - start:.1f} s")
        rows = []
        for step in options.steps:
            position = position_at(pattern, step, options.batch, options.workers)
            before = seconds_to_first_batch(pattern, step, options.batch, options.workers, None)
            after = seconds_to_first_batch(pattern, step, options.batch, options.workers, position)
            rows.append({"step": step, "read_and_drop_s": before, "stream_position_s": after})
    print(f"{'resume at step':>15} {'read and drop (s)':>18} {'stream position (s)':>20}")
    for row in rows:
        print(f"{row['step']:>15} {row['read_and_drop_s']:>18.2f} {row['stream_position_s']:>20.2f}")
    if options.out:
        options.out.write_text(json.dumps({"options": vars(options) | {"out": str(options.out)}, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
