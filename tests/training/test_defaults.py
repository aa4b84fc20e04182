"""Defaults that fit the data (issue 39): a warm-up as long as the run is cut to a tenth of it and recorded so, the
data-loader workers are capped by the CPUs this process may use, and a folder of images trained with the shipped
shapes VAE is warned about; each with a warning that names the numbers or the fix."""

import logging
from dataclasses import replace

import pytest
import torch
import yaml
from accelerate.state import PartialState
from torch.utils.data import IterableDataset, TensorDataset

from dit_trainer.data.loading import loader_workers
from dit_trainer.data.sources.shapes import write_shapes_folder
from dit_trainer.runs.run_folder import CONFIG
from dit_trainer.training.optim import build_lr_scheduler, warmup_within_run
from dit_trainer.training.shapes_vae import uses_shapes_vae, warn_shapes_vae_on_other_data

from ..conftest import QUICK, TINY_SHAPES, compose_config
from ..e2e.family_runs import train_in_process


def warnings_of(caplog, call):
    PartialState()  # accelerate's logger asks which process it is on
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        result = call()
    return result, [record.message for record in caplog.records if record.levelno == logging.WARNING]


def lr_at(cfg, step: int, updates_per_step: int = 1) -> float:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim.lr)
    scheduler = build_lr_scheduler(cfg.optim, optimizer, cfg.trainer.max_steps * updates_per_step)
    for _ in range(step):
        optimizer.step()
        scheduler.step()
    return scheduler.get_last_lr()[0]


def test_a_warmup_as_long_as_the_run_is_cut_to_a_tenth_with_a_warning(caplog):
    """The user trial: a 500-step warm-up on a 40-step run left the rate at 6 % of optim.lr at step 30."""
    cfg = compose_config([*TINY_SHAPES, "trainer.max_steps=40", "optim.warmup_steps=500"])
    assert lr_at(cfg, 30) == pytest.approx(cfg.optim.lr * 30 / 500)
    clipped, (warning,) = warnings_of(caplog, lambda: warmup_within_run(cfg.optim, 40))
    assert clipped.warmup_steps == 4 and lr_at(replace(cfg, optim=clipped), 30) == cfg.optim.lr
    assert "`optim.warmup_steps=500`" in warning and "`trainer.max_steps=40`" in warning and "over 4" in warning
    grpo, (warning,) = warnings_of(caplog, lambda: warmup_within_run(cfg.optim, 40, updates_per_step=4))
    assert grpo.warmup_steps == 16 and "x 4 updates per step = 160 updates" in warning


def test_a_warmup_shorter_than_the_run_or_unused_is_kept(caplog):
    cfg = compose_config([*TINY_SHAPES, "trainer.max_steps=40", "optim.warmup_steps=39"])
    assert warnings_of(caplog, lambda: warmup_within_run(cfg.optim, 40)) == (cfg.optim, [])
    constant = replace(cfg.optim, warmup_steps=500, lr_schedule="constant")
    assert warnings_of(caplog, lambda: warmup_within_run(constant, 40)) == (constant, [])


class Stream(IterableDataset):
    def __iter__(self):
        return iter(())


def test_workers_are_capped_by_this_processes_share_of_the_cpus(caplog, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    images = TensorDataset(torch.zeros(4))
    workers, (warning,) = warnings_of(caplog, lambda: loader_workers(8, images))
    assert workers == 2 and "`data.num_workers=8` is more than the 2 CPUs" in warning
    assert "`data.num_workers=2`" in warning
    assert warnings_of(caplog, lambda: loader_workers(2, images)) == (2, [])
    workers, (warning,) = warnings_of(caplog, lambda: loader_workers(8, Stream()))
    assert workers == 8 and "kept, as a stream's shard split and its saved position are per worker" in warning


def test_the_shapes_vae_is_recognised_and_only_other_data_is_warned_about(caplog):
    cfg = compose_config(TINY_SHAPES)
    assert uses_shapes_vae(cfg.vae) and not uses_shapes_vae(replace(cfg.vae, kind="pixel"))
    assert warnings_of(caplog, lambda: warn_shapes_vae_on_other_data(cfg.vae, cfg.data))[1] == []
    folder = replace(cfg.data, source="imagefolder", path="/photos")
    (warning,) = warnings_of(caplog, lambda: warn_shapes_vae_on_other_data(cfg.vae, folder))[1]
    assert "`data.source=imagefolder`" in warning and "`vae=sd`" in warning and "`vae=pixel`" in warning


def test_a_run_on_a_folder_warns_and_records_the_warmup_it_trained_with(tmp_path, caplog, monkeypatch):
    """Through the real run: a 2-step run with the 500-step warm-up records none, 8 workers on one CPU become one,
    and the shapes VAE meets a folder of images; each is said once."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    folder = write_shapes_folder(tmp_path / "folder", 16, [(32, 32)])
    overrides = ["data=imagefolder", f"data.path={folder}", "data.resolution=32", "data.num_workers=8"]
    with caplog.at_level(logging.WARNING):
        run_dir = train_in_process(tmp_path / "run", *QUICK, *overrides, "optim.warmup_steps=500")
    warnings = [record.message for record in caplog.records if record.levelno == logging.WARNING]
    for says in ("`optim.warmup_steps=500` is as long as the run", "`data.num_workers=8` is more than the 1 CPUs",
                 "`vae.pretrained` is the VAE shipped for the shapes demo"):  # fmt: skip
        assert sum(says in warning for warning in warnings) == 1, (says, warnings)
    assert yaml.safe_load((run_dir / CONFIG).read_text())["optim"]["warmup_steps"] == 0
