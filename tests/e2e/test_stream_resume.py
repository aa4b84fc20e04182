"""A streamed run (webdataset) resumed through ``train.py``: on 2 processes x 2 data-loader workers each process
saves its workers' stream positions, and the resumed run trains on exactly the batches the uninterrupted one did;
on changed shards (rewritten, fewer) the resume is refused in one paragraph (also when a worker refuses), or with
the change allowed starts the epoch again; a mixture source that cannot feed every worker is refused at start."""

import contextlib
import io
import json
import math
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from dit_trainer.data.stream_loader import worker_positions

from ..conftest import (
    CPU_PROCESSES,
    QUIET,
    TINY_SHAPES,
    accelerate_launch,
    digest,
    read_metrics,
    run_here,
    run_script,
    train_here,
)
from ..data.files import captioned_shards, noise_png, photos_folder


@pytest.mark.slow
def test_a_stream_resumed_mid_shard_and_mid_epoch_on_2_processes_and_2_workers_is_exact(tmp_path):
    """8 shards of 9 samples: each of the 4 workers reads 2 shards (18 samples) an epoch, so a process has 9
    batches of 4 an epoch; the checkpoint at step 3 stands inside a shard and the runs go on into epoch 2.
    Losses are averaged over both processes' batches, so equal losses mean equal batches on both."""
    shards = captioned_shards(tmp_path / "shards", 8, 9)
    common = [*TINY_SHAPES, "data=webdataset", f"data.path='{shards}'", "data.caption_column=txt", "vae=pixel",
              "data.resolution=16", "data.num_workers=2", "data.shuffle_buffer=5", "data.crop=random",
              "data.horizontal_flip=true", "data.cache_latents=false", "trainer.batch_size=4",
              "trainer.max_steps=12", "trainer.checkpoint_every=3", *QUIET]  # fmt: skip

    def launch(run_dir, *extra):
        result = run_script([*accelerate_launch(2), "train.py", *common, f"hydra.run.dir={run_dir}", *extra],
                            timeout=400, env=CPU_PROCESSES)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    launch(tmp_path / "straight")
    checkpoint = tmp_path / "straight" / "checkpoints" / "checkpoint-3"
    assert sorted(p.name for p in checkpoint.glob("data_stream_*.pt")) == ["data_stream_0.pt", "data_stream_1.pt"]
    result = launch(tmp_path / "resumed", f"trainer.resume={checkpoint}")
    assert "reading and dropping" not in result.stderr
    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == list(range(4, 13))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight[3:]]  # bit for bit


# --- a resume on changed data: refused in one paragraph, or restarted with the change allowed ----------------------


def _streamed(shards: str) -> list[str]:
    """TINY_SHAPES on ``shards`` at 16 px in pixel space, one data-loader worker, a checkpoint every 2 steps."""
    return ["data=webdataset", f"data.path='{shards}'", "data.caption_column=txt", "vae=pixel", "data.resolution=16",
            "data.num_workers=1", "data.cache_latents=false", "trainer.batch_size=4", "trainer.checkpoint_every=2",
            *QUIET]  # fmt: skip


@pytest.fixture(scope="module")
def streamed_run(tmp_path_factory):
    """A finished streamed run of 2 steps (4 shards of 8 samples) and its shards' pattern."""
    root = tmp_path_factory.mktemp("stream_resume")
    shards = captioned_shards(root / "shards", 4, 8)
    train_here(root / "run", *_streamed(shards), "trainer.max_steps=2")
    return root / "run", shards


@contextlib.contextmanager
def _rewritten_shards(shards: str, change):
    """The shards of ``shards`` rewritten by ``change(members) -> members`` for the block, then put back."""
    paths = sorted(Path(shards).parent.glob("*.tar"))
    backup = Path(shards).parent.parent / "backup"
    backup.mkdir()
    try:
        for path in paths:
            shutil.copy2(path, backup / path.name)
            with tarfile.open(path) as tar:
                members = [(info, tar.extractfile(info).read()) for info in tar.getmembers()]
            with tarfile.open(path, "w") as tar:
                for info, data in change(members):
                    tar.addfile(info, io.BytesIO(data))
            shutil.copystat(backup / path.name, path)  # the same modification time
        yield
    finally:
        for path in paths:
            shutil.copy2(backup / path.name, path)
        shutil.rmtree(backup)


def _refused(run_dir, *overrides: str, into=None) -> str:
    """train.py with ``overrides`` into ``into`` (default: ``run_dir``) exits 2 with one paragraph and no traceback,
    and ``run_dir``'s checkpoints, metrics and config are as they were. Returns the paragraph."""
    before = digest(run_dir)
    result = run_here(["train.py", *TINY_SHAPES, f"hydra.run.dir={into or run_dir}", *overrides])
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Caught" not in result.stderr
    owned = ("checkpoints", "metrics", "config.yaml")
    assert {k: v for k, v in digest(run_dir).items() if k.startswith(owned)} == {
        k: v for k, v in before.items() if k.startswith(owned)
    }
    (paragraph,) = [line.partition("error: ")[2] for line in result.stderr.splitlines() if "error: " in line]
    return paragraph


@pytest.mark.slow
def test_a_resume_on_shards_rewritten_with_other_images_is_refused(streamed_run):
    """Audit F6: the same names, byte sizes and modification times, other images (it resumed silently)."""
    run_dir, shards = streamed_run

    def other_images(members):  # noise PNGs of one byte length, so every header stays as it was
        return [
            (info, data if info.name.endswith(".txt") else noise_png(1000 + i))
            for i, (info, data) in enumerate(members)
        ]

    with _rewritten_shards(shards, other_images):
        paragraph = _refused(run_dir, *_streamed(shards), "trainer.max_steps=4", "trainer.resume=latest")
    assert "`data.path`" in paragraph and "000000.tar (other first bytes)" in paragraph
    assert "trainer.allow_config_change=true" in paragraph


@pytest.mark.slow
def test_a_stream_refusal_raised_in_a_data_loader_worker_is_one_paragraph(streamed_run, tmp_path):
    """Audit F7: a checkpoint written before streams recorded their shards, resumed on shards cut to 2 samples:
    the worker's own check refuses the saved position (it was `RuntimeError: Caught ConfigError in DataLoader
    worker process 0`, exit 1)."""
    run_dir, shards = streamed_run
    checkpoint = tmp_path / "old" / "checkpoints" / "checkpoint-2"
    shutil.copytree(run_dir / "checkpoints" / "checkpoint-2", checkpoint)
    saved = torch.load(checkpoint / "data_stream_0.pt", weights_only=True)
    for _, holder in worker_positions(saved["loader"]):
        for key in ("assigned", "listed", "fingerprints"):
            del holder["dataset_iter_state"][key]
    torch.save(saved, checkpoint / "data_stream_0.pt")
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"]["data_stream_0.pt"] = (checkpoint / "data_stream_0.pt").stat().st_size
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    with _rewritten_shards(shards, lambda members: members[:4]):  # 2 samples of png + txt
        paragraph = _refused(tmp_path / "old", *_streamed(shards), "trainer.max_steps=4",
                             f"trainer.resume={checkpoint}", into=tmp_path / "resumed")  # fmt: skip
    assert "`data.path`" in paragraph and "which no longer has it" in paragraph


@pytest.mark.slow
def test_a_mixture_source_without_a_share_for_every_worker_is_refused_before_training(tmp_path):
    """Audit F8: one shard for 2 workers was `Caught ConfigError in DataLoader worker process 1` after a step."""
    one_shard = captioned_shards(tmp_path / "shards", 1, 4)
    photos = photos_folder(tmp_path / "photos", 8)
    entries = (
        f"[{{source: webdataset, path: '{one_shard}', caption_column: txt}}, {{source: imagefolder, path: {photos}}}]"
    )
    paragraph = _refused(tmp_path, f"data.mixture={entries}", "vae=pixel", "data.resolution=16", "data.num_workers=2",
                         "data.cache_latents=false", "trainer.batch_size=4", "trainer.max_steps=2", *QUIET,
                         into=tmp_path / "run")  # fmt: skip
    assert "`data.mixture[0].path`" in paragraph and "1 shards for 1 processes x 2 data-loader workers" in paragraph
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_another_shard_list_with_the_change_allowed_restarts_the_epoch(streamed_run, tmp_path):
    """Audit F9: 4 shards -> 3 with `trainer.allow_config_change=true` was an IndexError in the worker."""
    run_dir, shards = streamed_run
    fewer = shards.replace("000003", "000002")
    result = train_here(tmp_path / "resumed", *_streamed(fewer), "trainer.max_steps=4",
                        "trainer.allow_config_change=true",
                        f"trainer.resume={run_dir / 'checkpoints' / 'checkpoint-2'}")  # fmt: skip
    log = result.stdout  # Hydra's console log
    assert "another shard list or order (4 shards at the checkpoint, 3 now)" in log
    assert "starts its epoch again on the current data" in log
    resumed = read_metrics(tmp_path / "resumed")
    assert [r["step"] for r in resumed] == [3, 4] and all(math.isfinite(r["loss"]) for r in resumed)
