"""Validation loss in a real ``train.py`` run: it falls as the run learns, and is recomputed bit-identically from a
checkpoint."""

import pytest

from dit_trainer.assemble import build_trainer
from dit_trainer.runs.run_folder import list_checkpoints

from ..conftest import TINY_SHAPES, VALIDATE, compose_config, read_metrics, train_here, validation_monitor


@pytest.mark.slow
def test_val_loss_falls_and_is_recomputed_bit_identically_from_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    train_here(run, "trainer.max_steps=40", "trainer.checkpoint_every=20", *VALIDATE)
    logged = {record["step"]: record for record in read_metrics(run) if "val/loss" in record}
    assert sorted(logged) == [10, 20, 30, 40]
    assert logged[40]["val/loss"] < logged[10]["val/loss"]
    strata = [key for key in logged[40] if key.startswith("val/loss/t_")]
    assert len(strata) == 8 and logged[40]["val/seconds"] > 0
    assert logged[40]["val/loss"] == pytest.approx(sum(logged[40][key] for key in strata) / 8)

    checkpoint = next(path for path in list_checkpoints(run / "checkpoints") if path.name.endswith("20"))
    cfg = compose_config([*TINY_SHAPES, "trainer.max_steps=40", *VALIDATE, f"trainer.resume={checkpoint}"])
    trainer = build_trainer(cfg, run)
    recomputed = validation_monitor(trainer)(trainer.dit, 20)
    assert recomputed["val/loss"] == logged[20]["val/loss"]  # bit-identical, not approximately
    assert all(recomputed[key] == logged[20][key] for key in strata)
