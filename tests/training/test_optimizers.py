"""The optimizers ``optim.name`` picks (``training/optimizers.py``): each trains a tiny DiT in the run's parameter
groups under the LR schedule and continues bit for bit from an accelerate checkpoint; a missing package and a
Prodigy learning rate meant for AdamW are refused in one paragraph before any model is built."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from accelerate import Accelerator

from dit_trainer.config import OptimConfig, TrainConfig, TrainerConfig
from dit_trainer.errors import ConfigError
from dit_trainer.training.optim import ConfiguredRates, build_lr_scheduler, build_optimizer
from dit_trainer.training.optimizers import check_optimizer, check_resumed_optimizer, check_sharded_optimizer

from ..conftest import TINY_SHAPES, build_tiny_transformer, compose_config, one_paragraph, run_here, tiny_batch


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _needs(package: str):
    return pytest.mark.skipif(not _installed(package), reason=f"{package} is not installed")


# (optim.name, a learning rate in its convention, steps: Prodigy's step size grows from 1e-6 before the loss moves)
CASES = [
    pytest.param("adamw", 1e-2, 8, id="adamw"),
    pytest.param("adafactor", 1e-1, 8, id="adafactor"),
    pytest.param("prodigy", 1.0, 30, id="prodigy", marks=_needs("prodigyopt")),
    pytest.param("adamw8bit", 1e-2, 8, id="adamw8bit", marks=_needs("bitsandbytes")),
]


def _config(name: str, lr: float, steps: int) -> TrainConfig:
    """Weight decay on, so the learned-variance DiT's ``proj_out`` is a group of its own; a 2-step warm-up."""
    return TrainConfig(
        optim=OptimConfig(name=name, lr=lr, weight_decay=0.1, warmup_steps=2, lr_schedule="cosine"),
        trainer=TrainerConfig(max_steps=steps),
    )


def _prepared(cfg: TrainConfig):
    """A seeded learned-variance tiny DiT, its optimizer and LR schedule, prepared by a (CPU) accelerator. For
    8-bit AdamW heads of 32 dims: matrices above the 4,096 values below which bitsandbytes keeps 32 bits."""
    accelerator = Accelerator(cpu=True)
    head = 32 if cfg.optim.name == "adamw8bit" else 8
    dit = build_tiny_transformer(learned_sigma=True, condition_dim=12, seed=0, attention_head_dim=head)
    optimizer = build_optimizer(cfg.optim, dit)
    scheduler = build_lr_scheduler(cfg.optim, optimizer, cfg.trainer.max_steps)
    return accelerator, *accelerator.prepare(dit, optimizer, scheduler)


def _train(dit, optimizer, schedule, steps: int) -> list[float]:
    x, t, condition, target = tiny_batch()
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(dit(x, t, condition), target)
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _equal(a, b) -> bool:
    """Deep equality of optimizer states: nested dicts and lists (bitsandbytes nests its quantisation state) of
    tensors, compared exactly, and plain values."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_equal, a, b))
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    return a == b


@pytest.mark.parametrize(("name", "lr", "steps"), CASES)
def test_each_optimizer_trains_in_the_run_s_groups_and_resumes_bit_for_bit(name, lr, steps, tmp_path):
    """A few steps with the warm-up and cosine schedule; a checkpoint half way, and a fresh model, optimizer and
    schedule loaded from it continue with the same losses, weights and optimizer state."""
    cfg = _config(name, lr, steps)
    resume_at = steps // 2
    accelerator, dit, optimizer, schedule = _prepared(cfg)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.0]  # proj_out: no decay
    proj = dit.transformer.proj_out
    variance = proj.weight.detach().view(4, 8, -1)[:, 4:].clone()  # (patch x patch, 2 x 4 channels, in)
    losses = _train(dit, optimizer, schedule, resume_at)
    accelerator.save_state(tmp_path / "checkpoint")
    losses += _train(dit, optimizer, schedule, steps - resume_at)
    assert losses[-1] < 0.9 * losses[0], losses
    assert torch.equal(proj.weight.detach().view(4, 8, -1)[:, 4:], variance)  # ignored by the loss: as loaded
    if name == "adamw8bit":
        assert any(state["state1"].dtype == torch.uint8 for state in optimizer.state.values())
    assert optimizer.param_groups[0]["lr"] == schedule.get_last_lr()[0] != lr  # the schedule drives it

    resumed_accelerator, resumed, resumed_optimizer, resumed_schedule = _prepared(cfg)
    configured = ConfiguredRates(resumed_optimizer, resumed_schedule)  # taken and put back as a resume does
    resumed_accelerator.load_state(tmp_path / "checkpoint")
    configured.reapply()  # the same settings: nothing the optimizer learned (Prodigy's estimate) is reset
    resumed_losses = _train(resumed, resumed_optimizer, resumed_schedule, steps - resume_at)
    assert resumed_losses == losses[resume_at:]
    assert all(torch.equal(a, b) for a, b in zip(dit.parameters(), resumed.parameters()))
    assert _equal(resumed_optimizer.state_dict(), optimizer.state_dict())
    if name == "prodigy":  # its step-size estimate is in the groups, and it grew from d0
        assert resumed_optimizer.param_groups[0]["d"] == optimizer.param_groups[0]["d"] > 1e-6


def test_a_missing_package_is_refused_with_its_install_command_before_any_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # what `import bitsandbytes` meets where it is absent
    with pytest.raises(ConfigError) as error:
        check_optimizer(OptimConfig(name="adamw8bit"))
    message = one_paragraph(error.value, "optim.name")
    assert "bitsandbytes" in message and "`pip install bitsandbytes`" in message and "optim.name=adamw" in message

    result = run_here(["train.py", *TINY_SHAPES, "optim.name=adamw8bit", "trainer.max_steps=1"])
    assert result.returncode == 2, result.stderr[-2000:]
    assert "`pip install bitsandbytes`" in result.stderr and "Traceback" not in result.stderr
    assert "step" not in result.stdout.lower()  # refused by the config checks: nothing was built or trained


def test_prodigy_with_a_learning_rate_meant_for_adamw_is_refused():
    with pytest.raises(ConfigError) as error:
        compose_config([*TINY_SHAPES, "optim.name=prodigy"])  # optim.lr stays 1e-4
    assert "optim.lr=1.0" in one_paragraph(error.value, "optim.lr")
    assert compose_config([*TINY_SHAPES, "optim.name=adafactor"]).optim.name == "adafactor"


def test_sharded_launches_and_resumes_with_another_optimizer_are_refused(tmp_path):
    check_sharded_optimizer(OptimConfig(name="prodigy", lr=1.0), sharded=False)
    with pytest.raises(ConfigError) as error:
        check_sharded_optimizer(OptimConfig(name="prodigy", lr=1.0), sharded=True)
    assert "FSDP" in one_paragraph(error.value, "optim.name")
    check_resumed_optimizer(tmp_path, {"optim": {"lr": 1e-4}}, {"optim": {"name": "adamw"}})  # from before the choice
    with pytest.raises(ConfigError) as error:
        check_resumed_optimizer(tmp_path, {"optim": {"name": "adamw"}}, {"optim": {"name": "prodigy"}})
    assert "optim.name=adamw" in one_paragraph(error.value, "optim.name")
