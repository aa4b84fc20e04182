"""A streamed run (webdataset) resumed through ``train.py`` on 2 processes x 2 data-loader workers: each process
saves its workers' stream positions, and the resumed run trains on exactly the batches the uninterrupted one did."""

import pytest

from ..conftest import CPU_PROCESSES, QUIET, TINY_SHAPES, accelerate_launch, read_metrics, run_script
from ..data.files import captioned_shards


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
