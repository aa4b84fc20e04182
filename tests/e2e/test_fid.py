"""FID through ``train.py``'s monitor and ``scripts/evaluate.py``: a trained checkpoint scores lower than an early one,
as the monitor logged."""

import json

import pytest

from ..conftest import read_metrics, run_here, train_here


@pytest.mark.slow
def test_evaluate_reports_a_lower_fid_for_a_trained_checkpoint_than_an_early_one_as_the_monitor_did(tmp_path):
    run = tmp_path / "run"
    train_here(run, "trainer.max_steps=60", "trainer.checkpoint_every=10", "validation.every_n_steps=60",
          "validation.split=0.25", "trainer.sample_every=0", "monitor.fid.enabled=true", "monitor.fid.features=vae",
          "monitor.fid.every_n_steps=60")  # fmt: skip
    monitored = [record for record in read_metrics(run) if "fid/fid" in record]
    assert [record["step"] for record in monitored] == [60] and monitored[0]["fid/seconds"] > 0
    fid = {}
    for step in (10, 60):
        out = tmp_path / f"eval{step}"
        result = run_here(
            ["scripts/evaluate.py", str(run), f"checkpoint={run / 'checkpoints' / f'checkpoint-{step}'}",
             "metrics=[fid]", "fid_features=vae", f"out_dir={out}"]
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads((out / "report.json").read_text())
        assert report["fid_images"] == report["fid_reference_images"] == 64
        assert not (out / "grid.png").exists()  # no rewards asked for
        fid[step] = report["fid"]
    assert fid[60] < fid[10]
    assert fid[60] == pytest.approx(monitored[0]["fid/fid"], rel=1e-9)  # same weights, seeds, sampler, reference
    # The reference was computed once, kept in the run's folder (no cache folder set): the monitor's, read back.
    assert len(list((run / "fid_reference").glob("*.safetensors"))) == 1
