"""The training loop and its seams: the preflight, the update strategy (clipping), the non-finite guard, and
batches that continue where a resumed run stopped."""

import os
import signal

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader, Dataset, IterableDataset

from dit_trainer.data.collate import collate_batch
from dit_trainer.data.poisson import PoissonBatchSampler, collate_poisson
from dit_trainer.errors import EXIT_NONFINITE, EXIT_PREEMPTED, ConfigError, GradientFlowError, NonFiniteError
from dit_trainer.run_folder import list_checkpoints
from dit_trainer.training.batches import resumable_batches
from dit_trainer.training.checkpoint import TrainingState
from dit_trainer.training.nonfinite import NonFiniteGuard
from dit_trainer.training.preemption import PreemptionHandler
from dit_trainer.training.preflight import preflight
from dit_trainer.training.run import build_trainer

from .conftest import TINY_SHAPES, compose_config, read_metrics, run_script, start_training, tiny_loss, train, wait_for

QUIET = ("trainer.log_every=1", "trainer.sample_every=0")


def test_preflight_turns_a_planted_no_grad_into_the_doctor_s_explanation(tiny_parts, image_batch):
    tiny_parts.dit.forward = torch.no_grad()(tiny_parts.dit.forward)  # the planted bug
    with pytest.raises(GradientFlowError) as caught:
        preflight(tiny_parts.dit, lambda: tiny_loss(tiny_parts, image_batch).mean())
    message = str(caught.value)
    assert "[grad_disabled]" in message and "DiTAdapter" in message and "torch.no_grad" in message
    assert not isinstance(caught.value.__cause__, RuntimeError)  # the doctor's words, not PyTorch's error


def test_preflight_names_parameters_that_get_no_gradient(tiny_parts, image_batch):
    tiny_parts.dit.transformer.register_parameter("orphan", torch.nn.Parameter(torch.zeros(3)))
    with pytest.raises(GradientFlowError, match=r"(?s)\[unused_params\].*`transformer\.orphan`"):
        preflight(tiny_parts.dit, lambda: tiny_loss(tiny_parts, image_batch).mean())


def test_preflight_refuses_a_fully_frozen_dit(tiny_parts, image_batch):
    tiny_parts.dit.requires_grad_(False)
    with pytest.raises(GradientFlowError, match=r"\[no_trainable_params\]"):
        preflight(tiny_parts.dit, lambda: tiny_loss(tiny_parts, image_batch).mean())


def test_preflight_passes_a_healthy_step_and_changes_nothing(tiny_parts, image_batch):
    before = {name: p.detach().clone() for name, p in tiny_parts.dit.named_parameters()}
    preflight(tiny_parts.dit, lambda: tiny_loss(tiny_parts, image_batch).mean())
    assert all(p.grad is None and torch.equal(p, before[n]) for n, p in tiny_parts.dit.named_parameters())


@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e6, 0.0])
def test_the_optimizer_steps_on_gradients_clipped_to_max_grad_norm(tmp_path, max_grad_norm):
    """The trainer clips (its own path, not accelerate's) and returns the norm before clipping: the optimizer sees
    min(norm, max_grad_norm), and untouched gradients when the norm is under the limit or clipping is off."""
    cfg = compose_config([*TINY_SHAPES, "monitor.grpo.enabled=false", f"optim.max_grad_norm={max_grad_norm}"])
    trainer = build_trainer(cfg, tmp_path)
    seen = []
    trainer.update.optimizer.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(
            torch.nn.utils.get_total_norm([p.grad for p in trainer.dit.parameters()])
        )
    )
    _, grad_norm = trainer.train_step(trainer.batches())
    expected = min(grad_norm.item(), max_grad_norm or float("inf"))
    assert grad_norm.item() > 1e-3 and seen[0].item() == pytest.approx(expected, rel=1e-5)


class Numbered(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> dict:
        return {"caption": str(index)}


def _captions(batches, count: int) -> list[list[str]]:
    return [next(batches)["caption"] for _ in range(count)]


def test_map_style_batches_resume_mid_epoch_in_the_same_order():
    """Micro-step k of a resumed run reads what the uninterrupted run read at k: same shuffle, epochs included."""
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))

    def loader():
        data = DataLoader(Numbered(), batch_size=3, shuffle=True, drop_last=True, collate_fn=collate_batch)
        return accelerator.prepare_data_loader(data, device_placement=False)

    uninterrupted = _captions(resumable_batches(loader(), accelerator, 0), 8)  # 3 batches an epoch: 2 epochs+
    assert uninterrupted[0] != uninterrupted[3]  # epochs are shuffled differently
    for start in (2, 4):
        assert _captions(resumable_batches(loader(), accelerator, start), 8 - start) == uninterrupted[start:]


def test_poisson_batches_resume_at_the_step():
    """Step s's draw depends only on s, so a run resumed at step 7 reads draws 7, 8, ... (an empty draw included)."""
    sampler = PoissonBatchSampler(num_samples=10, steps_per_epoch=3, seed=1)
    data = DataLoader(Numbered(), batch_sampler=sampler, collate_fn=collate_poisson)
    resumed = resumable_batches(data, Accelerator(cpu=True), 7)
    expected = [[str(i) for i in PoissonBatchSampler(10, 3, seed=1).indices(step)] for step in range(7, 13)]
    assert [next(resumed).get("caption", []) for _ in range(6)] == expected
    assert any(expected) and len(set(map(tuple, expected))) > 1


class Empty(IterableDataset):
    def __iter__(self):
        return iter(())


def test_every_process_needs_one_full_batch():
    """Incomplete batches are dropped: fewer items than batch size x processes would leave a process with none."""
    from dit_trainer.data.loading import require_full_batches

    require_full_batches(32, batch_size=16, processes=2)
    with pytest.raises(ConfigError) as caught:
        require_full_batches(20, batch_size=16, processes=2)
    message = str(caught.value)
    assert "`trainer.batch_size` is 16, but the data set has 20 items" in message and "2 processes" in message
    assert "`trainer.batch_size=10`" in message
    with pytest.raises(ConfigError, match="add data"):
        require_full_batches(1, batch_size=4, processes=2)


def test_a_stream_that_yields_no_batch_names_data_path():
    data = DataLoader(Empty(), batch_size=4, collate_fn=collate_batch)
    data.dataset.set_epoch = lambda epoch: None
    with pytest.raises(ConfigError, match=r"`data.path` is '/data/shards'.*no complete batch"):
        next(resumable_batches(data, Accelerator(cpu=True), 0, "/data/shards"))


def _guard(model: torch.nn.Module, max_consecutive: int = 3) -> NonFiniteGuard:
    state = TrainingState(torch.Generator())
    advice = ["lower the learning rate (`optim.lr=0.001` -> e.g. `optim.lr=0.0001`)"]
    return NonFiniteGuard(Accelerator(cpu=True), model, state, max_consecutive, advice, lambda: 1e-3)


def test_non_finite_steps_are_skipped_counted_and_then_stop_the_run_with_a_report():
    model = torch.nn.Linear(2, 2)
    model.weight.grad = torch.full_like(model.weight, float("nan"))
    guard = _guard(model)
    finite, nan = torch.tensor(1.0), torch.tensor(float("nan"))
    assert not guard.check(nan, finite) and not guard.check(finite, grad_norm=nan)
    assert guard.check(finite, grad_norm=torch.tensor(2.0))  # a finite step resets the count of consecutive ones
    assert guard.state.skipped_steps == 2
    assert not guard.check(nan, finite) and not guard.check(nan, finite)
    with pytest.raises(NonFiniteError) as caught:
        guard.check(nan, grad_norm=nan)
    message = str(caught.value)
    assert guard.state.skipped_steps == 5
    assert "for 3 consecutive steps (`trainer.max_consecutive_nonfinite=3`)" in message
    assert "Parameters with non-finite gradients: weight." in message and "`optim.lr=0.0001`" in message


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_exits_3_and_resume_matches_the_uninterrupted_run(tmp_path):
    """The stop skips the monitors due at its step (sample grids every step here): the grace period before the
    kill is for the checkpoint."""
    train(tmp_path / "straight", "trainer.max_steps=30", *QUIET)
    run_dir = tmp_path / "preempted"
    process = start_training(run_dir, "trainer.max_steps=30", "trainer.checkpoint_every=0", "trainer.sample_every=1")
    wait_for(lambda: len(read_metrics(run_dir)) >= 3, process)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == EXIT_PREEMPTED, stderr[-3000:]
    stopped = len(read_metrics(run_dir))
    assert 3 <= stopped < 30 and "Preempted at step" in stdout
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == [f"checkpoint-{stopped}"]
    grids = sorted(p.name for p in (run_dir / "samples").iterdir())
    assert grids == [f"step_{step:07d}.png" for step in range(1, stopped)]

    train(run_dir, "trainer.max_steps=30", "trainer.resume=latest", *QUIET)
    straight = [r["loss"] for r in read_metrics(tmp_path / "straight")]
    assert [r["loss"] for r in read_metrics(run_dir)] == pytest.approx(straight, rel=1e-6)


@pytest.mark.slow
def test_a_planted_nan_is_skipped_then_stops_the_run_with_a_report(tmp_path):
    run_dir = tmp_path / "run"
    result = run_script(
        ["train.py", *TINY_SHAPES, f"hydra.run.dir={run_dir}", *QUIET, "trainer.max_steps=30", "optim.lr=1e6",
         "optim.warmup_steps=0", "trainer.max_consecutive_nonfinite=3"],
        timeout=240,
    )  # fmt: skip
    assert result.returncode == EXIT_NONFINITE, result.stderr[-3000:]
    error = result.stderr
    assert "NaN/inf for 3 consecutive steps" in error and "lower the learning rate" in error
    assert "Parameters with non-finite gradients: transformer." in error and "Traceback" not in error
    records = read_metrics(run_dir)
    assert [r["skipped_steps"] for r in records] == [0, 1, 2]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX signals")
def test_the_preemption_handler_turns_signals_into_a_flag_and_restores_handlers():
    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionHandler() as handler:
        assert handler.requested is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert handler.requested == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal keeps the first reason
        assert handler.requested == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) == before
