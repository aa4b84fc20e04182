"""The training loop: one step of the training method per iteration, then logging, checkpoints and monitors when
they are due.

The loop is model- and method-agnostic. What a step computes is the method's ``TrainingStep`` (``training.step``:
the supervised step on data batches, or GRPO's epoch of rollouts and policy updates); how its gradients become an
update is the ``update`` strategy (accelerate's accumulation and clipping, or DP-SGD) run by the one
``UpdateSequence``. The loop, checkpoints, resume, monitors and metrics are the same for every method.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import broadcast_object_list
from diffusers.training_utils import EMAModel
from torch import nn
from tqdm.auto import tqdm

from dit_trainer.runs.run_folder import METRICS, kept_checkpoints, list_checkpoints, set_aside_newer
from dit_trainer.runs.run_lock import RunFolderLock
from dit_trainer.runs.run_summary import write_summary
from dit_trainer.training.metrics import (
    METRIC_LINES,
    MetricsFile,
    mean_over_processes,
    metric_line,
    save_loss_curve,
)
from dit_trainer.training.monitors.monitors import Monitor, MonitorFailed, MonitorVerdict
from dit_trainer.training.monitors.tracker_media import Trackers
from dit_trainer.training.nonfinite import NonFiniteGuard
from dit_trainer.training.preemption import PreemptionHandler
from dit_trainer.training.state.checkpoint import Checkpointer
from dit_trainer.training.state.checkpoint_manifest import refuse_resume_past_the_end
from dit_trainer.training.step import TrainingStep
from dit_trainer.training.summary import RunEnd, summarize, summary_line
from dit_trainer.training.update import Update

logger = get_logger(__name__)
LOSSES_SINCE_LOG = "loss"  # the per-step losses the next log step averages, in the state's ``since_log``


@dataclass(frozen=True)
class LoopSettings:
    """What the loop needs of the config: how long, and when to log and checkpoint."""

    max_steps: int
    log_every: int
    checkpoint_every: int  # 0: only at the end
    images_per_step: int  # over all processes and accumulated micro-batches


@dataclass
class TrainResult:
    steps: int
    final_loss: float
    seconds: float
    run_dir: Path
    monitor_seconds: float = 0.0  # of ``seconds``, the time spent in monitors (sample grids, reward monitor)
    preempted: bool = False  # stopped by a signal after writing a checkpoint
    interrupted: bool = False  # that signal was Ctrl-C (SIGINT): the user's stop, not a scheduler's


class Trainer:
    """Trains ``dit`` with the method's ``step`` (whose updates run through ``update``); checkpoints through
    ``checkpointer``, whose ``state`` holds the step count and the generator every random draw of a step comes
    from."""

    def __init__(
        self,
        *,
        settings: LoopSettings,
        run_dir: Path,
        accelerator: Accelerator,
        dit: nn.Module,
        update: Update,
        checkpointer: Checkpointer,
        guard: NonFiniteGuard,
        step: TrainingStep,
        ema: EMAModel | None = None,
        monitors: list[Monitor] | None = None,
        run_lock: RunFolderLock | None = None,
        trackers: Trackers | None = None,
    ) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.accelerator = accelerator
        self.dit = dit
        self.update = update
        self.checkpointer = checkpointer
        self.state = checkpointer.state
        self.guard = guard
        self.step = step
        self.ema = ema
        self.monitors = monitors or []
        self.run_lock = run_lock  # released when ``fit`` ends, however it ends, or by ``close``
        self.trackers = trackers  # the monitors' images and the checkpoints' weights go there too
        self.metrics = MetricsFile(run_dir / METRICS)
        self._start_step, self._started, self.monitor_seconds = 0, time.perf_counter(), 0.0
        self.stop_reason: str | None = None  # why a monitor stopped the run before max_steps
        self._trackers_finished = False

    def resume(self, spec: str | None) -> None:
        """Continue from ``spec`` (``latest`` or a path) if set; metrics logged after that step (by an interrupted
        attempt) are dropped so ``metrics.jsonl`` describes one run. Resumed from a checkpoint older than the run's
        newest, the later checkpoints and their metrics are set aside: a branch abandoned, kept for reference."""
        path = self.checkpointer.restore(spec)
        if path is not None:  # before anything in the folder changes (an older checkpoint than checked may load)
            refuse_resume_past_the_end(path, self.state.step, self.settings.max_steps)
        if path is not None:
            logger.info(f"Resumed from {path} at step {self.state.step}", main_process_only=True)
        elif spec:
            logger.warning(  # a requeued job's first attempt; or `latest` in a new folder, which resumes nothing
                f"trainer.resume=latest, but {self.checkpointer.checkpoints_dir} holds no checkpoint yet: starting "
                "from step 0. To continue an earlier run, name it: `trainer.resume=RUN` (its folder), or its "
                "`hydra.run.dir` with `trainer.resume=latest`.",
                main_process_only=True,
            )
        if not self.accelerator.is_main_process:
            return
        dropped = self.metrics.truncate_after(self.state.step)
        aside = set_aside_newer(self.checkpointer.checkpoints_dir, self.state.step) if path is not None else None
        if aside is not None:
            abandoned = MetricsFile(aside / METRICS)
            for record in dropped:
                abandoned.write(record)
            logger.warning(
                f"Resumed from {path.name}, older than the run's newest checkpoint: the later ones "
                f"({', '.join(sorted(p.name for p in aside.iterdir() if p.is_dir()))}) and the metrics they logged "
                f"are set aside in {aside}, neither resumed from nor pruned"
            )

    def _is_due(self, every: int) -> bool:
        step = self.state.step
        return step == self.settings.max_steps or (every > 0 and step % every == 0)

    def _add_to_log_window(self, step_loss: torch.Tensor) -> None:
        window = self.state.since_log.get(LOSSES_SINCE_LOG)
        step_loss = step_loss.detach().float().reshape(1)
        self.state.since_log[LOSSES_SINCE_LOG] = step_loss if window is None else torch.cat([window, step_loss])

    def _train_metrics(self, grad_norm: torch.Tensor, steps: int, since: float) -> dict[str, float]:
        """What a log step writes: the loop's step metrics, then the method's."""
        return self._step_metrics(grad_norm, steps, since) | self.step.metrics()

    def _step_metrics(self, grad_norm: torch.Tensor, steps: int, since: float) -> dict[str, float]:
        """Loss (mean over the steps since the last log and over processes), lr, grad norm and throughput (of the
        ``steps`` this process trained since ``since``)."""
        loss = mean_over_processes(self.accelerator, self.state.since_log.pop(LOSSES_SINCE_LOG))
        seconds = time.perf_counter() - since  # measured after .item(): the device has caught up
        return {
            **self.update.metrics(),
            "loss": loss,
            "lr": self.update.current_lr(),
            "grad_norm": float(grad_norm),
            "skipped_steps": self.state.skipped_steps,  # so far: updates skipped for non-finite loss or gradients
            # so far, fp16 only: updates the grad scaler skipped while it lowered its scale (not non-finite steps)
            **({"scaler_overflows": self.state.scaler_overflows} if self.accelerator.scaler is not None else {}),
            "images_per_sec": self.settings.images_per_step * steps / seconds,
            "seconds_per_step": seconds / steps,
        }

    def _run_monitors(self) -> tuple[dict[str, float], list[MonitorVerdict], float]:
        """The monitors due at this step: their metrics, what they ask of the run (decided on the main process,
        the same on every process) and the seconds they took."""
        metrics, verdicts, start = {}, [], time.perf_counter()
        for monitor in self.monitors:
            if self._is_due(monitor.every_n_steps):
                metrics.update(monitor(self.dit, self.state.step))
                failure, name = monitor.failure, type(monitor).__name__
                failed = f"{name} at step {self.state.step}: {type(failure).__name__}: {failure}" if failure else None
                verdicts.append(monitor.verdict() if failed is None else MonitorVerdict(failed=failed))
        if verdicts and self.accelerator.num_processes > 1:
            verdicts = broadcast_object_list([verdicts])[0]
        return metrics, verdicts, time.perf_counter() - start

    def _stop_if_a_monitor_failed(self, verdicts: list[MonitorVerdict]) -> None:
        """A monitor that raised stops the run, but after its step's checkpoint with that step's monitors pending:
        they run first when the run resumes, so fixing the monitor costs no training and every logged value is the
        uninterrupted run's."""
        failed = [verdict.failed for verdict in verdicts if verdict.failed]
        if not failed:
            return
        self.state.monitors_pending = True
        path = self.checkpointer.save(self.state.step)
        raise MonitorFailed(
            f"A monitor failed ({'; '.join(failed)}). The training of step {self.state.step} is checkpointed in "
            f"{path}, its monitors pending: fix the cause, then continue with `python train.py "
            f"trainer.resume={self.run_dir}` (they run first)."
        ) from next((monitor.failure for monitor in self.monitors if monitor.failure), None)  # on the main process

    def _apply(self, verdicts: list[MonitorVerdict]) -> str | None:
        """Keep this step's checkpoint under the names the monitors gave; the reason to stop early, if a monitor
        gave one (at ``max_steps`` the run ends anyway)."""
        for verdict in verdicts:
            if verdict.keep:
                self.checkpointer.keep(verdict.keep, self.state.step)
        reason = next((verdict.stop for verdict in verdicts if verdict.stop), None)
        return reason if self.state.step < self.settings.max_steps else None

    def _write(self, metrics: dict[str, float], amend: bool = False) -> None:
        """One line of metrics.jsonl (or, ``amend``, additions to this step's line) and one tracker log for this
        step. Training metrics go to trackers as ``train/<name>``; monitor metrics already carry their section
        (``reward/mean``)."""
        if self.accelerator.is_main_process:
            if amend:
                self.metrics.amend(self.state.step, metrics)
            else:
                self.metrics.write({"step": self.state.step, **metrics})
            METRIC_LINES.info(metric_line(self.state.step, self.settings.max_steps, metrics))
        self.accelerator.log({k if "/" in k else f"train/{k}": v for k, v in metrics.items()}, step=self.state.step)

    def _catch_up_monitors(self) -> None:
        """The monitors of the step a preemption checkpointed before they ran (its grace period is the checkpoint's)
        run on resuming, before training goes on, and that step's checkpoint is written again after them: their
        readings join the step's line, and the checkpoints they keep and a stop they ask for are a run's never
        stopped."""
        self.state.monitors_pending = False
        metrics, verdicts, seconds = self._run_monitors()
        self.monitor_seconds += seconds
        if metrics:
            self._write(metrics, amend=True)
        self._stop_if_a_monitor_failed(verdicts)
        self.stop_reason = self._apply(verdicts)
        if verdicts:
            self.checkpointer.save(self.state.step)
        if self.stop_reason:
            logger.warning(f"Stopped at step {self.state.step}: {self.stop_reason}", main_process_only=True)

    def fit(self) -> TrainResult:
        """Train to ``max_steps`` (or a stop signal); ``summary.json`` is written however it ends, and the run folder
        is given back."""
        try:
            return self._fit()
        except BaseException as error:
            self._summarize(f"stopped: {type(error).__name__}", time.perf_counter() - self._started)
            raise
        finally:
            if self.run_lock is not None:
                self.run_lock.release()

    def close(self) -> None:
        """Give back what building the trainer took: the trackers' run (W&B's, TensorBoard's writer) and the run
        folder's lock (with its heartbeat thread). A trainer built from Python and dropped without ``fit`` (to
        inspect its parts, or after an error of the caller's) would otherwise keep the folder locked until the
        process exits. ``fit`` gives the lock back however it ends, and the trackers when it completes (after an
        error they are left for ``close``, or for the process's exit, which records it). Closing again does
        nothing; the process group stays, for the trainers built after this one. ``with build_trainer(...) as
        trainer:`` closes on leaving the block."""
        try:
            self._finish_trackers()
        finally:
            if self.run_lock is not None:
                self.run_lock.release()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _finish_trackers(self) -> None:
        if not self._trackers_finished:
            self._trackers_finished = True
            for tracker in self.accelerator.trackers:
                tracker.finish()

    def _fit(self) -> TrainResult:
        settings = self.settings
        batches = self.step.batches()
        progress = tqdm(
            total=settings.max_steps,
            initial=self.state.step,
            desc="train",
            disable=not self.accelerator.is_main_process,
            dynamic_ncols=True,
        )
        start = self._started = time.perf_counter()
        self._start_step = self.state.step
        # The losses since the last log are in the state (a resumed run averages the ones before the resume too);
        # the time and steps since then are this process's.
        window_start, timed_steps, loss = time.perf_counter(), 0, float("nan")
        preempted = interrupted = False
        with PreemptionHandler() as preemption:
            self.guard.preemption = preemption
            if self.state.monitors_pending:
                self._catch_up_monitors()
            while not self.stop_reason and self.state.step < settings.max_steps:
                step_loss, grad_norm = self.step(batches)
                self.state.step += 1
                self._add_to_log_window(step_loss)
                timed_steps += 1
                progress.update(1)
                metrics = {}
                if self._is_due(settings.log_every):
                    metrics = self._train_metrics(grad_norm, timed_steps, window_start)
                    loss = metrics["loss"]
                    progress.set_postfix(loss=f"{loss:.4f}", img_s=f"{metrics['images_per_sec']:.0f}")
                    window_start, timed_steps = time.perf_counter(), 0
                checkpoint_start = time.perf_counter()
                # A pending stop skips the monitors: the grace period before the kill is for the checkpoint.
                preempted = self.state.step < settings.max_steps and self._stop_requested(preemption)
                self.state.monitors_pending = preempted  # in the checkpoint: they run on resuming
                monitor_metrics, verdicts, seconds = ({}, [], 0.0) if preempted else self._run_monitors()
                self.monitor_seconds += seconds
                if metrics or monitor_metrics:
                    self._write(metrics | monitor_metrics)
                self._stop_if_a_monitor_failed(verdicts)
                stop_reason = self._apply(verdicts)
                # Last: a run killed before the checkpoint is complete resumes from the one before, and rewrites the
                # metrics logged since; one killed after it has already logged this step.
                kept_now = any(verdict.keep for verdict in verdicts)
                if preempted or stop_reason or kept_now or self._is_due(settings.checkpoint_every):
                    path = self.checkpointer.save(self.state.step)
                    if self.trackers is not None:
                        self.trackers.log_checkpoint(path, self.state.step, self.state.step == settings.max_steps)
                window_start += time.perf_counter() - checkpoint_start  # checkpoints and monitors are not training
                if stop_reason:
                    logger.warning(f"Stopped at step {self.state.step}: {stop_reason}", main_process_only=True)
                    self.stop_reason = stop_reason
                    break
                if preempted:
                    interrupted = self._interrupted_anywhere(preemption)
                    signal = preemption.requested.name if preemption.requested else "another process's signal"
                    logger.warning(
                        f"Stopped by {signal} at step {self.state.step} after writing a checkpoint; continue with "
                        f"`python train.py trainer.resume={self.run_dir}`",
                        main_process_only=True,
                    )
                    break
        progress.close()
        seconds = time.perf_counter() - start
        if self.accelerator.is_main_process:
            save_loss_curve(self.metrics.read(), self.run_dir / "loss_curve.png")
        stopped_by_signal = "interrupted" if interrupted else "preempted"  # the user's Ctrl-C, or a scheduler's signal
        self._summarize(
            stopped_by_signal if preempted else "stopped early" if self.stop_reason else "completed", seconds
        )
        self.accelerator.wait_for_everyone()  # every rank done before the process group goes away
        self._trackers_finished = True
        self.accelerator.end_training()  # the trackers finished, the process group destroyed
        return TrainResult(self.state.step, loss, seconds, self.run_dir, self.monitor_seconds, preempted, interrupted)

    def _summarize(self, status: str, seconds: float) -> None:
        """``summary.json`` and the closing log line, by the main process (no collective: after an error the other
        processes may be gone). A summary that cannot be written is a warning, never the run's error."""
        if not self.accelerator.is_main_process:
            return
        try:
            checkpoints = list_checkpoints(self.checkpointer.checkpoints_dir)
            weights = self.checkpointer.weights.weights_dir(checkpoints[-1], ema=True) if checkpoints else None
            end = RunEnd(status, self.state.step, self.settings.max_steps, self._start_step, seconds,
                         self.monitor_seconds, weights, self.stop_reason,
                         kept_checkpoints(self.checkpointer.checkpoints_dir))  # fmt: skip
            summary = summarize(self.metrics.read(), end, self.run_dir)
            write_summary(summary, self.run_dir)
        except Exception as error:  # after an error too: never the run's error in its place
            logger.warning(f"could not write the run's summary.json: {error}", main_process_only=True)
            return
        logger.info(summary_line(summary, self.run_dir), main_process_only=True)

    def _interrupted_anywhere(self, preemption: PreemptionHandler) -> bool:
        """Whether any process's stop was a Ctrl-C, so that all exit alike (130, not a requeue's 3) when it reached
        only some of them (the head node of a multi-node launch). Asked once, at the stop every process agreed on."""
        if self.accelerator.num_processes == 1:
            return preemption.interrupted
        flag = torch.tensor(float(preemption.interrupted), device=self.accelerator.device)
        return bool(self.accelerator.reduce(flag, reduction="sum").item())

    def _stop_requested(self, preemption: PreemptionHandler) -> bool:
        """Whether any process got a stop signal: all of them must stop at the same step, so with several the
        answer is the one the step's non-finite check agreed on (a signal that arrives after it counts next step).
        A step that ran no check (a GRPO epoch whose rewards gave no update) asks the processes itself."""
        if self.accelerator.num_processes == 1:
            return preemption.requested is not None
        agreed, self.guard.stop_agreed = self.guard.stop_agreed, None  # read once: the next step checks anew
        if agreed is not None:
            return agreed
        flag = torch.tensor(float(preemption.requested is not None), device=self.accelerator.device)
        return bool(self.accelerator.reduce(flag, reduction="sum").item())
