"""The training loop: accelerate primitives, one optimizer step per iteration, monitors on a schedule."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from diffusers.training_utils import EMAModel
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from tqdm.auto import tqdm

from dit_trainer.components import trainable_parameters
from dit_trainer.config import ConfigError, TrainConfig
from dit_trainer.diagnostics import diagnose_gradient_flow
from dit_trainer.diffusion.schedule import NoiseSchedule
from dit_trainer.training.checkpoint import (
    Checkpointer,
    TrainingState,
    config_hash,
    resolve_checkpoint,
    weights_format,
)
from dit_trainer.training.data_health import BadFileCounter
from dit_trainer.training.metrics import MetricsFile, TimestepLossBuckets, mean_over_processes, save_loss_curve
from dit_trainer.training.monitors import Monitor
from dit_trainer.training.preemption import PreemptionHandler
from dit_trainer.training.privacy import PrivateTraining, is_empty
from dit_trainer.training.step import diffusion_loss

logger = get_logger(__name__)


class GradientFlowError(RuntimeError):
    """The preflight before the first step found that the loss cannot train the DiT (the message says why)."""


class NonFiniteError(RuntimeError):
    """Too many consecutive steps with non-finite loss or gradients; the message reports what and suggests fixes."""


@dataclass
class TrainResult:
    steps: int
    final_loss: float
    seconds: float
    run_dir: Path
    monitor_seconds: float = 0.0  # of ``seconds``, the time spent in monitors (sample grids, reward monitor)
    preempted: bool = False  # stopped by a signal after writing a checkpoint


# What a finding means in this trainer's config, appended to the doctor's generic advice.
CONFIG_HINTS = {
    "reentrant_checkpoint": "In this trainer: set `trainer.reentrant_checkpointing=false`.",
    "no_trainable_params": "In this trainer only the VAE and the text encoder are frozen (and the base under LoRA).",
}


def _value(tensor: torch.Tensor | None) -> float:
    return float("nan") if tensor is None else tensor.item()


def preflight(dit: nn.Module, compute_loss: Callable[[], torch.Tensor]) -> None:
    """Before the first step: the gradient-flow doctor on the real loss. A problem becomes a ``GradientFlowError``
    that explains its cause (rather than PyTorch's "does not require grad" from deep inside backward)."""
    report = diagnose_gradient_flow(dit, compute_loss)
    if not report.ok:
        hints = [CONFIG_HINTS[code] for code in report.codes if code in CONFIG_HINTS]
        raise GradientFlowError("\n".join([str(report), *hints]))


class Trainer:
    """Noise-prediction training of a DiT whose VAE and text encoder are frozen."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        accelerator: Accelerator,
        dit: nn.Module,
        vae,
        text_encoder,
        schedule: NoiseSchedule,
        dataloader: DataLoader,
        optimizer: torch.optim.Optimizer,
        lr_scheduler,
        ema: EMAModel | None,
        monitors: list[Monitor],
        privacy: PrivateTraining | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.accelerator = accelerator
        self.dit = dit
        self.vae = vae
        self.text_encoder = text_encoder
        self.schedule = schedule
        self.dataloader = dataloader
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.ema = ema
        self.monitors = monitors
        self.privacy = privacy
        if privacy is not None:
            logger.info(privacy.describe(), main_process_only=True)
        self._preflight_done = False
        generator = torch.Generator(accelerator.device).manual_seed(cfg.trainer.seed + accelerator.process_index)
        self.state = TrainingState(generator, {"dp_noise": privacy.optimizer.generator} if privacy else None)
        self.checkpointer = Checkpointer(
            accelerator,
            run_dir / "checkpoints",
            self.state,
            ema,
            cfg.trainer.checkpoints_total_limit,
            weights_format(cfg.lora.enabled),
            config_hash(dataclasses.asdict(cfg)),
            {"privacy_accountant": privacy} if privacy else None,
        )
        self._consecutive_nonfinite = 0
        self.metrics = MetricsFile(run_dir / "metrics.jsonl")
        self.bad_files = BadFileCounter(accelerator, cfg.data.max_bad_fraction, cfg.data.path)
        self._trainable_parameters = trainable_parameters(accelerator.unwrap_model(dit).transformer)
        self.timestep_losses = TimestepLossBuckets(schedule.num_train_timesteps, accelerator.device)

    def resume(self) -> None:
        """Continue from ``trainer.resume`` (``latest`` or a path) if set; metrics logged after that step (by an
        interrupted attempt) are dropped so ``metrics.jsonl`` describes one run."""
        path = resolve_checkpoint(self.cfg.trainer.resume, self.checkpointer.checkpoints_dir)
        if path is not None:
            self.checkpointer.load(path)
            logger.info(f"Resumed from {path} at step {self.state.step}", main_process_only=True)
        elif self.cfg.trainer.resume:
            logger.info("trainer.resume=latest but no checkpoint exists yet: starting from step 0")
        if self.accelerator.is_main_process and self.metrics.path.exists():
            kept = [r for r in self.metrics.read() if r["step"] <= self.state.step]
            self.metrics.path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")

    def batches(self) -> Iterator[dict]:
        """Endless batches, continuing the epoch and position a resumed run stopped at."""
        micro_steps = self.state.step * self.cfg.trainer.gradient_accumulation_steps
        if self.privacy is not None:  # Poisson batches: step s's draw depends only on s
            self.dataloader.batch_sampler.next_step = self.state.step
            while True:
                yield from self.dataloader
        if isinstance(self.dataloader.dataset, IterableDataset):
            yield from self._stream_batches(micro_steps)
            return
        epoch, skip = divmod(micro_steps, len(self.dataloader))
        while True:
            self.dataloader.set_epoch(epoch)
            loader = self.accelerator.skip_first_batches(self.dataloader, skip) if skip else self.dataloader
            yield from loader
            epoch, skip = epoch + 1, 0

    def _stream_batches(self, skip: int) -> Iterator[dict]:
        """Batches of a streamed data set (webdataset): its length is unknown, so a resumed run reads and drops
        the batches it already trained on (same order: the shard shuffle is seeded by the epoch)."""
        epoch = 0
        while True:
            self.dataloader.dataset.set_epoch(epoch)
            batches = 0
            for batch in self.dataloader:
                batches += 1
                if skip:
                    skip -= 1
                    continue
                yield batch
            if batches == 0:
                raise ConfigError(
                    "data.path",
                    self.cfg.data.path,
                    f"an epoch of it gave this process no complete batch of {self.cfg.trainer.batch_size}",
                    "check the shards (and that there are at least as many as processes x workers), or lower "
                    "`trainer.batch_size`",
                )
            epoch += 1

    def train_step(self, batches: Iterator[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches; returns (loss, grad norm).

        Both stay tensors on the device: reading them (a GPU sync) waits for the next log step.
        """
        if self.privacy is not None:
            return self._private_step(next(batches))
        trainer, losses, grad_norm = self.cfg.trainer, [], torch.tensor(float("nan"))
        finite = True
        for _ in range(trainer.gradient_accumulation_steps):
            batch = next(batches)
            self.bad_files.add(batch)
            if not self._preflight_done:
                self._preflight(batch)
            with self.accelerator.accumulate(self.dit):
                per_sample, timesteps = self._loss(batch, self.dit, self.state.generator)
                self.timestep_losses.add(per_sample, timesteps)
                loss = per_sample.mean()
                self.accelerator.backward(loss)
                losses.append(loss.detach())
                if self.accelerator.sync_gradients:
                    grad_norm = self._gradient_norm()
                    finite = self._check_finite(torch.stack(losses).mean(), grad_norm)
                    if finite:
                        self._clip_gradients(grad_norm)
                # fp16's grad scaler must see the step to skip it and lower its scale itself.
                if finite or self.accelerator.scaler is not None:
                    self.optimizer.step()
                    self.lr_scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
        if finite and self.ema is not None:
            self.ema.step(self._trainable_parameters)
        return torch.stack(losses).mean(), grad_norm

    def _gradient_norm(self) -> torch.Tensor:
        """The total norm of the (fp16: unscaled) gradients over the parameters that train."""
        self.accelerator.unscale_gradients()
        return torch.nn.utils.get_total_norm([p.grad for p in self._trainable_parameters if p.grad is not None])

    def _clip_gradients(self, grad_norm: torch.Tensor) -> None:
        """Scale the gradients down to ``optim.max_grad_norm`` when their norm is above it.

        What ``accelerator.clip_grad_norm_`` does for the single-process and DDP models this trainer prepares (FSDP
        is refused), without its two costs per step: walking the module for its parameters and rescaling every
        gradient even when the norm is under the limit (together 1-2 % of a small DiT's step on CPU). The
        comparison reads the norm that the finite check has just synchronised, so it adds no device sync.
        """
        max_norm = self.cfg.optim.max_grad_norm
        if max_norm and grad_norm.item() > max_norm:
            torch.nn.utils.clip_grads_with_norm_(self._trainable_parameters, max_norm, grad_norm)

    def _private_step(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """One DP-SGD step on a Poisson-sampled batch: Opacus clips each sample's gradient to
        ``privacy.max_grad_norm`` (so ``optim.max_grad_norm`` is not applied) and adds noise; the grad norm
        returned is that of the noised gradient the optimizer applied, which is as private as the weights."""
        self.bad_files.add(batch)
        if is_empty(batch):  # no image drawn: the step still adds noise, as the accounting assumes
            loss = torch.tensor(0.0, device=self.accelerator.device)
            self.privacy.backward_empty()
        else:
            if not self._preflight_done:
                self._preflight(batch)
            per_sample, timesteps = self._loss(batch, self.dit, self.state.generator)
            self.timestep_losses.add(per_sample, timesteps)
            loss = per_sample.detach().mean()
            self.privacy.backward(per_sample)
        grad_norm = torch.tensor(float("nan"))
        finite = self._check_finite(loss)
        if finite:
            self.optimizer.step()
            self.lr_scheduler.step()
            grad_norm = self._gradient_norm()
        self.optimizer.zero_grad(set_to_none=True)
        if finite and self.ema is not None:
            self.ema.step(self._trainable_parameters)
        return loss, grad_norm

    def _check_finite(self, loss: torch.Tensor, grad_norm: torch.Tensor | None = None) -> bool:
        """Whether this step's loss and gradients are finite on every process (one sync per step). A non-finite
        step is skipped and counted; ``trainer.max_consecutive_nonfinite`` of them in a row stop the run."""
        bad = ~torch.isfinite(loss) if grad_norm is None else ~torch.isfinite(loss) | ~torch.isfinite(grad_norm)
        bad = bad.float()
        if self.accelerator.num_processes > 1:
            bad = self.accelerator.reduce(bad, reduction="sum")
        if not bad.item():
            self._consecutive_nonfinite = 0
            return True
        self.state.skipped_steps += 1
        self._consecutive_nonfinite += 1
        if self._consecutive_nonfinite >= self.cfg.trainer.max_consecutive_nonfinite:
            raise NonFiniteError(self._nonfinite_report(loss, grad_norm))
        logger.warning(
            f"step {self.state.step + 1}: non-finite loss ({loss.item():.4g}) or gradient norm "
            f"({_value(grad_norm):.4g}); the update is skipped"
        )
        return False

    def _nonfinite_report(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> str:
        model = self.accelerator.unwrap_model(self.dit)
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        shown = ", ".join(bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "") if bad else "none"
        t, o = self.cfg.trainer, self.cfg.optim
        suggestions = [f"lower the learning rate (`optim.lr={o.lr:g}` -> e.g. `optim.lr={o.lr / 10:g}`)"]
        if self.accelerator.mixed_precision == "fp16":
            suggestions.append("train in bf16 (`trainer.mixed_precision=bf16`), whose range does not overflow")
        if not o.max_grad_norm and self.privacy is None:  # under DP, Opacus clips every sample
            suggestions.append("clip gradients (`optim.max_grad_norm=1.0`)")
        return (
            f"Training stopped at step {self.state.step + 1}: the loss or the gradients were NaN/inf for "
            f"{self._consecutive_nonfinite} consecutive steps (`trainer.max_consecutive_nonfinite="
            f"{t.max_consecutive_nonfinite}`), and each of those updates was skipped. Last step: loss "
            f"{loss.item():.4g}, gradient norm {_value(grad_norm):.4g}, lr {self.lr_scheduler.get_last_lr()[0]:.4g}. "
            f"Parameters with non-finite gradients: {shown}. To fix it, {'; or '.join(suggestions)}. Checkpoints "
            "written so far are intact; `trainer.resume=latest` continues from the newest."
        )

    def _loss(self, batch: dict, dit: nn.Module, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-sample training loss (B,) of ``batch`` and the timesteps (B,) it was taken at."""
        return diffusion_loss(
            batch, dit, self.vae, self.text_encoder, self.schedule, generator, self.cfg.data.caption_dropout
        )

    def _preflight(self, batch: dict) -> None:
        """The doctor on the first batch of this process, with a copy of the trainer's generator: the step that
        follows draws exactly what it would have drawn without the check."""
        model = self.accelerator.unwrap_model(self.dit)
        generator = torch.Generator(self.state.generator.device)
        generator.set_state(self.state.generator.get_state())

        def compute_loss() -> torch.Tensor:
            with self.accelerator.autocast():
                return self._loss(batch, model, generator)[0].mean()

        with self.privacy.hooks_paused() if self.privacy else contextlib.nullcontext():
            preflight(model, compute_loss)
        self._preflight_done = True

    def _is_due(self, every: int) -> bool:
        step = self.state.step
        return step == self.cfg.trainer.max_steps or (every > 0 and step % every == 0)

    def _train_metrics(
        self, losses: list[torch.Tensor], grad_norm: torch.Tensor, since: float, images_per_step: int
    ) -> dict[str, float]:
        """Loss (mean over the steps since the last log and over processes), lr, grad norm and throughput."""
        loss = mean_over_processes(self.accelerator, losses)
        seconds = time.perf_counter() - since  # measured after .item(): the device has caught up
        privacy = {"privacy/epsilon": self.privacy.epsilon()} if self.privacy else {}
        return {
            **privacy,
            "loss": loss,
            "lr": self.lr_scheduler.get_last_lr()[0],
            "grad_norm": float(grad_norm),
            "skipped_steps": self.state.skipped_steps,  # so far: updates skipped for non-finite loss or gradients
            "images_per_sec": images_per_step * len(losses) / seconds,
            "seconds_per_step": seconds / len(losses),
        }

    def _run_monitors(self) -> tuple[dict[str, float], float]:
        """The monitors due at this step: their metrics and the seconds they took."""
        metrics, start = {}, time.perf_counter()
        for monitor in self.monitors:
            if self._is_due(monitor.every_n_steps):
                metrics.update(monitor(self.dit, self.state.step))
        return metrics, time.perf_counter() - start

    def _write(self, metrics: dict[str, float]) -> None:
        """One line of metrics.jsonl and one tracker log for this step. Training metrics go to trackers as
        ``train/<name>``; monitor metrics already carry their section (``reward/mean``)."""
        if self.accelerator.is_main_process:
            self.metrics.write({"step": self.state.step, **metrics})
        self.accelerator.log({k if "/" in k else f"train/{k}": v for k, v in metrics.items()}, step=self.state.step)

    def fit(self) -> TrainResult:
        trainer = self.cfg.trainer
        images_per_step = trainer.batch_size * trainer.gradient_accumulation_steps * self.accelerator.num_processes
        batches = self.batches()
        progress = tqdm(
            total=trainer.max_steps,
            initial=self.state.step,
            desc="train",
            disable=not self.accelerator.is_main_process,
            dynamic_ncols=True,
        )
        start = time.perf_counter()
        window_start, window_losses, loss, monitor_seconds = time.perf_counter(), [], float("nan"), 0.0
        saved_step, preempted = None, False
        with PreemptionHandler() as preemption:
            while self.state.step < trainer.max_steps:
                step_loss, grad_norm = self.train_step(batches)
                self.state.step += 1
                window_losses.append(step_loss)
                progress.update(1)
                metrics = {}
                if self._is_due(trainer.log_every):
                    metrics = self._train_metrics(window_losses, grad_norm, window_start, images_per_step)
                    metrics |= self.bad_files.check() | self.timestep_losses.collect(self.accelerator)
                    loss = metrics["loss"]
                    progress.set_postfix(loss=f"{loss:.4f}", img_s=f"{metrics['images_per_sec']:.0f}")
                    window_start, window_losses = time.perf_counter(), []
                checkpoint_start = time.perf_counter()
                if self._is_due(trainer.checkpoint_every):
                    self.checkpointer.save(self.state.step)
                    saved_step = self.state.step
                monitor_metrics, seconds = self._run_monitors()
                monitor_seconds += seconds
                if metrics or monitor_metrics:
                    self._write(metrics | monitor_metrics)
                window_start += time.perf_counter() - checkpoint_start  # checkpoints and monitors are not training
                if self.state.step < trainer.max_steps and self._stop_requested(preemption):
                    if saved_step != self.state.step:
                        self.checkpointer.save(self.state.step)
                    logger.warning(
                        f"Stopped by {preemption.requested.name} at step {self.state.step} after writing a "
                        "checkpoint; continue with trainer.resume=latest",
                        main_process_only=True,
                    )
                    preempted = True
                    break
        progress.close()
        seconds = time.perf_counter() - start
        if self.accelerator.is_main_process:
            save_loss_curve(self.metrics.read(), self.run_dir / "loss_curve.png")
        self.accelerator.wait_for_everyone()  # every rank done before the process group goes away
        self.accelerator.end_training()
        return TrainResult(self.state.step, loss, seconds, self.run_dir, monitor_seconds, preempted)

    def _stop_requested(self, preemption: PreemptionHandler) -> bool:
        """Whether any process got a stop signal: all of them must stop at the same step."""
        if self.accelerator.num_processes == 1:
            return preemption.requested is not None
        flag = torch.tensor(float(preemption.requested is not None), device=self.accelerator.device)
        return bool(self.accelerator.reduce(flag, reduction="sum").item())
