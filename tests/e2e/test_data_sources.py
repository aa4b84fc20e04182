"""Each file-based data source (imagefolder, hf, webdataset) through ``train.py``: it feeds a run and its skipped
files are counted, and a mostly unreadable data set stops the run naming the files."""

import json
import re

import datasets
import pytest

from ..conftest import QUIET, TINY_SHAPES, run_here, train_here
from ..data.files import HF_FEATURES, image_folder, noise_png, png_bytes, write_shards

TRAIN_SMALL = ["vae=pixel", "data.resolution=16", "data.num_workers=0", "trainer.batch_size=4", "trainer.max_steps=5",
               *QUIET, "trainer.ema_decay=0"]  # fmt: skip


def _training_data(root, source: str, good: int = 11, bad: int = 1) -> str:
    """``good`` readable images and ``bad`` truncated PNGs in the format of ``source``; returns data.path."""
    files = {f"{i:02d}.png": png_bytes((20 * i, 100, 200 - 10 * i)) for i in range(good)}
    files |= {f"bad{i}.png": noise_png(i)[:300] for i in range(bad)}
    if source == "imagefolder":
        return str(image_folder(root, [{"file_name": n, "text": f"picture {n}"} for n in files], files))
    if source == "hf":
        rows = {"image": [{"bytes": data, "path": name} for name, data in files.items()],
                "text": [f"picture {n}" for n in files]}  # fmt: skip
        datasets.Dataset.from_dict(rows, features=HF_FEATURES).save_to_disk(root / "saved")
        return str(root / "saved")
    samples = [{"__key__": name[:-4], "png": data, "txt": f"picture {name}"} for name, data in files.items()]
    return "'" + write_shards(root, [samples[::2], samples[1::2]]) + "'"  # quoted: Hydra would parse the braces


@pytest.mark.slow
@pytest.mark.parametrize("source", ["imagefolder", "hf", "webdataset"])
def test_each_source_feeds_a_training_run_and_counts_skipped_files(tmp_path, source):
    path = _training_data(tmp_path, source)
    run_dir = tmp_path / "run"
    train_here(run_dir, f"data={source}", f"data.path={path}", *TRAIN_SMALL)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert 1 <= records[-1]["data/skipped"] <= 2  # 20 images read from 12 files: the bad one once or twice


@pytest.mark.slow
def test_a_mostly_unreadable_data_set_stops_the_run_naming_the_files(tmp_path):
    path = _training_data(tmp_path, "imagefolder", good=6, bad=6)
    result = run_here(["train.py", *TINY_SHAPES, f"hydra.run.dir={tmp_path / 'run'}", "data=imagefolder",
                       f"data.path={path}", *TRAIN_SMALL, "data.max_bad_fraction=0.2"])  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "were unreadable and skipped, more than `data.max_bad_fraction=0.2`" in result.stderr
    assert re.search(r"the first: bad\d.png: OSError: image file is truncated; bad\d.png", result.stderr)
