"""The start banner (``training/banner.py``): one block naming the run folder, processes and device, precision, the
data, the effective batch, the steps, the checkpoint cadence and where the metrics go. Built here from a real
accelerator and plain data sets; ``tests/training/test_loggers.py`` reads it from a run's log."""

from __future__ import annotations

import dataclasses

from accelerate import Accelerator
from torch.utils.data import Dataset

from dit_trainer.grpo.method import GRPO
from dit_trainer.training.banner import describe_data, describe_run

from ..conftest import TINY_SHAPES, compose_config


class BucketedItems(Dataset):
    """Items with the per-item ``buckets`` list a bucketed data set carries."""

    def __init__(self, buckets: list[int]) -> None:
        self.buckets = buckets

    def __len__(self) -> int:
        return len(self.buckets)

    def __getitem__(self, index: int) -> int:
        return index


def test_the_banner_says_what_the_run_will_do_and_where(tmp_path):
    cfg = compose_config([*TINY_SHAPES, "trainer.batch_size=4", "trainer.gradient_accumulation_steps=2",
                          "trainer.max_steps=10", "trainer.checkpoint_every=5", "trainer.checkpoints_total_limit=2",
                          "trainer.sample_every=0", "validation.split=0.2", "validation.every_n_steps=5"])  # fmt: skip
    accelerator = Accelerator(cpu=True)
    data = describe_data(
        cfg.data, cfg.trainer, cfg.validation, list(range(40)), list(range(8)), accelerator.num_processes
    )
    assert data.described == "40 items (+ 8 validation images held out) at 32 px; 5 steps per epoch"
    banner = describe_run(cfg.trainer, cfg.precision, cfg.monitor, cfg.validation, accelerator, tmp_path, data, 8, 3,
                          "METRICS")  # fmt: skip
    lines = {line[2:15].strip(): line[15:] for line in banner.splitlines()[1:]}
    assert lines == {
        "Run folder": str(tmp_path.resolve()),
        "Processes": "1 process on cpu (no GPU found)",
        "Precision": "fp32 (auto: no CUDA GPU, and bf16 autocast is slower than fp32 on a CPU)",
        "Data": data.described,
        "Batch": "8 images per step = 4 per process x 2 accumulation steps x 1 process",
        "Steps": "10 (about 2 epochs), resuming at step 3; a log line every 5",
        "Checkpoints": f"every 5 steps and at the end, into {tmp_path.resolve() / 'checkpoints'} (the newest 2 kept)",
        "Monitors": "sample grid at the end; validation loss every 5 steps",
        "Metrics": "METRICS",
    }
    fp8 = dataclasses.replace(cfg.precision, fp8=True, fp8_emulate=True)
    banner = describe_run(cfg.trainer, fp8, cfg.monitor, cfg.validation, accelerator, tmp_path, data, 8, 3, "")
    assert "slower than fp32 on a CPU); the blocks' linear layers in FP8 (tensorwise, emulated)" in banner


def test_bucketed_data_counts_only_full_batches_per_epoch():
    cfg = compose_config([*TINY_SHAPES, "trainer.batch_size=4"])
    data = describe_data(
        cfg.data, cfg.trainer, cfg.validation, BucketedItems([0] * 9 + [1] * 6 + [2] * 3), None, processes=2
    )
    # 2 + 1 + 0 full batches of 4, over 2 processes: 1 step per epoch
    assert data.described == "18 items in 3 buckets; 1 step per epoch" and data.steps_per_epoch == 1
    one = describe_data(cfg.data, cfg.trainer, cfg.validation, BucketedItems([0] * 8), None, processes=1)
    assert one.described == "8 items in 1 bucket; 2 steps per epoch"


def test_a_clip_run_says_its_clips_frames():
    cfg = compose_config([*TINY_SHAPES, "trainer.batch_size=4"])
    clips = dataclasses.replace(cfg.data, frames=5)
    data = describe_data(clips, cfg.trainer, cfg.validation, list(range(8)), None, processes=1)
    assert data.described == "8 items at 32 px, clips of 5 frames; 2 steps per epoch"


def test_a_grpo_run_describes_its_rollouts():
    cfg = compose_config(TINY_SHAPES)
    cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, prompts_per_epoch=6, group_size=8))
    data = describe_data(
        cfg.data, cfg.trainer, cfg.validation, None, None, processes=2, inputs=GRPO.ask(GRPO.describe_inputs, cfg)
    )
    assert data.described == "GRPO rollouts: 6 prompts x 8 images per process" and data.steps_per_epoch is None
