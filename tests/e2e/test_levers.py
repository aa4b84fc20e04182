"""The GPU check's levers toward higher MFU, each one switch, on the CPU: each trains and a resumed run repeats the
uninterrupted one bit for bit (their speed is measured by the check's rows on a GPU; FP8's emulated path is in
``tests/components/test_fp8.py``). Selective checkpointing recomputes what the forward computed: the same losses as
no checkpointing at all."""

import math

import pytest

from ..conftest import read_metrics, train_here

pytestmark = pytest.mark.slow
COMMON = ("trainer.max_steps=4", "trainer.checkpoint_every=2", "trainer.log_every=1", "trainer.sample_every=0",
          "optim.warmup_steps=0", "data.length=64")  # fmt: skip
LEVERS = {
    "selective checkpointing": ("trainer.gradient_checkpointing=true", "trainer.gradient_checkpointing_every=2"),
    "gradient accumulation": ("trainer.gradient_accumulation_steps=2",),
    "static regional compile": ("trainer.compile=true",),
    "fused q/k/v projections": ("trainer.fused_qkv=true",),
}


def _losses(run_dir) -> dict[int, float]:
    return {record["step"]: record["loss"] for record in read_metrics(run_dir)}


@pytest.mark.parametrize("lever", sorted(LEVERS))
def test_each_lever_trains_and_resumes_bit_exact(lever, tmp_path):
    train_here(tmp_path / "straight", *COMMON, *LEVERS[lever])
    checkpoint = tmp_path / "straight" / "checkpoints" / "checkpoint-2"
    train_here(tmp_path / "resumed", *COMMON, *LEVERS[lever], f"trainer.resume={checkpoint}")
    straight, resumed = _losses(tmp_path / "straight"), _losses(tmp_path / "resumed")
    assert sorted(straight) == list(range(1, 5)) and all(math.isfinite(loss) for loss in straight.values())
    assert [resumed[step] for step in (3, 4)] == [straight[step] for step in (3, 4)]
    if lever == "selective checkpointing":  # (that it keeps what it should: tests/components/test_meta.py)
        train_here(tmp_path / "plain", *COMMON, "trainer.max_steps=2")
        assert [straight[step] for step in (1, 2)] == list(_losses(tmp_path / "plain").values())
