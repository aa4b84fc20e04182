"""Trackers (``dit_trainer.training.monitors.trackers``): what W&B and TensorBoard receive, and what differential
privacy keeps off trackers that send it elsewhere (``metrics.jsonl`` always has everything)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import wandb

from dit_trainer.assemble import build_trainer
from dit_trainer.config import LoggerConfig, PrivacyConfig, TrainConfig
from dit_trainer.training.launch import build_accelerator
from dit_trainer.training.monitors.trackers import start_trackers
from tests.conftest import QUIET, TINY_SHAPES, compose_config, read_metrics

# One log line as the trainer writes it: training metrics under train/, the rest in their own sections.
LINE = {"train/loss": 0.4242, "loss/t_0-99": 0.5151, "train/skipped_steps": 0, "data/skipped": 0,
        "train/lr": 0.001, "train/grad_norm": 2.5, "privacy/epsilon": 1.25, "reward/mean": 0.75}  # fmt: skip
COMPUTED_ON_BATCHES = ("train/loss", "loss/t_0-99", "train/skipped_steps", "data/skipped")
PUBLIC = ("train/lr", "train/grad_norm", "privacy/epsilon", "reward/mean")


def _written_by_tracker(run_dir, name: str) -> bytes:
    """What the tracker wrote: W&B's offline run file (what `wandb sync` uploads), TensorBoard's event files."""
    if name == "wandb":
        wandb.teardown()  # the run's finish() returns before W&B's service has written everything
    pattern = "wandb/offline-run-*/run-*.wandb" if name == "wandb" else "logs/**/events.out.tfevents.*"
    return b"".join(path.read_bytes() for path in run_dir.glob(pattern))


def _log_line(run_dir, logger: str, privacy: dict) -> bytes:
    """Start the trackers as train.py does, log LINE once, end the run; returns what the tracker wrote."""
    cfg = TrainConfig(privacy=PrivacyConfig(**privacy), logger=LoggerConfig(name=logger, mode="offline"))
    accelerator = build_accelerator(cfg.trainer, cfg.logger, run_dir)
    start_trackers(accelerator, cfg.logger, run_dir, dataclasses.asdict(cfg))
    accelerator.log(LINE, step=1)
    accelerator.end_training()
    return _written_by_tracker(run_dir, logger)


DP = {"enabled": True, "noise_multiplier": 1.0}


@pytest.mark.parametrize(
    ("logger", "privacy", "withheld"),
    [
        ("wandb", DP, True),
        ("wandb", {**DP, "log_losses_to_trackers": True}, False),  # the user opted in
        ("wandb", {}, False),  # no DP: nothing to protect
        ("tensorboard", DP, False),  # files in the run folder, as metrics.jsonl
    ],
    ids=["dp-wandb", "dp-wandb-opted-in", "no-dp-wandb", "dp-tensorboard"],
)
def test_under_dp_metrics_computed_on_the_batches_stay_off_wandb(tmp_path, caplog, logger, privacy, withheld):
    with caplog.at_level(logging.WARNING):
        written = _log_line(tmp_path, logger, privacy)
    assert all(key.encode() in written for key in PUBLIC)
    assert all((key.encode() in written) != withheld for key in COMPUTED_ON_BATCHES)
    warnings = [r.getMessage() for r in caplog.records if "privacy.log_losses_to_trackers" in r.getMessage()]
    assert len(warnings) == (1 if withheld else 0)


@pytest.mark.slow
def test_a_dp_run_sends_no_loss_to_wandb_and_keeps_it_in_metrics_jsonl(tmp_path):
    overrides = [*TINY_SHAPES, "privacy.enabled=true", "privacy.noise_multiplier=1.0", "trainer.max_steps=2", *QUIET,
                 "logger=wandb", "logger.mode=offline"]  # fmt: skip
    build_trainer(compose_config(overrides), tmp_path).fit()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert all("loss" in r and any(key.startswith("loss/t_") for key in r) for r in records)
    written = _written_by_tracker(tmp_path, "wandb")
    assert b"train/lr" in written and b"privacy/epsilon" in written
    assert b"train/loss" not in written and b"loss/t_" not in written
