"""The run's own counters, generators and place in the data: what accelerate does not checkpoint by itself."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

DATA_POSITION = "data_position"  # epoch, batches, images per batch, batch size per process
SINCE_LOG = "since_log."  # the prefix of the accumulators' names in the file


@dataclass(frozen=True)
class DataPosition:
    """Where a shuffled data order stands: ``batches`` micro-batches into ``epoch``, each of ``images_per_batch``
    images over all processes (``batch_size`` per process). The step count alone cannot say this once the batch
    size, the gradient accumulation or the number of processes changes at a resume: counted in the new
    micro-batches, it would skip or repeat up to whole epochs."""

    epoch: int
    batches: int
    images_per_batch: int
    batch_size: int

    def micro_steps(self, batches_per_epoch: int, images_per_batch: int) -> int:
        """This position as micro-steps of a loader of ``batches_per_epoch`` batches of ``images_per_batch`` images:
        the same epoch, after the images read (rounded down to a whole batch: a partial one is read again)."""
        batches = min(self.batches * self.images_per_batch // images_per_batch, batches_per_epoch)
        return self.epoch * batches_per_epoch + batches


class TrainingState:
    """The step counter, the counts of steps skipped for non-finite gradients and of fp16 grad-scaler overflows,
    whether the step's monitors are still to run (a preemption's checkpoint is written before them), the data
    position (for a shuffled map-style data set; None otherwise), what the next log step averages (``since_log``,
    by name: the per-step losses, the losses by timestep; each process's own, so that a resumed run logs what the
    uninterrupted one did), the trainer's random generator (one per process), and other named generators (DP noise)."""

    def __init__(self, generator: torch.Generator, other_generators: dict[str, torch.Generator] | None = None) -> None:
        self.step = 0
        self.skipped_steps = 0
        self.scaler_overflows = 0
        self.monitors_pending = False
        self.data_position: DataPosition | None = None
        self.since_log: dict[str, torch.Tensor] = {}
        self.generator = generator
        self.other_generators = other_generators or {}

    def save(self, path: Path) -> None:
        counts = [self.step, self.skipped_steps, self.scaler_overflows, int(self.monitors_pending)]
        tensors = {"counters": torch.tensor(counts, dtype=torch.int64), "generator": self.generator.get_state()}
        if self.data_position is not None:
            tensors[DATA_POSITION] = torch.tensor(dataclasses.astuple(self.data_position), dtype=torch.int64)
        tensors |= {f"generator.{name}": g.get_state() for name, g in self.other_generators.items()}
        tensors |= {f"{SINCE_LOG}{name}": value.detach().cpu().contiguous() for name, value in self.since_log.items()}
        save_file(tensors, path)

    def load(self, folder: Path, process_index: int) -> None:
        """This process's state from checkpoint ``folder``. A process the checkpoint did not have (resumed on more
        processes) takes the counters of process 0 and keeps its own freshly seeded generators."""
        own = folder / f"trainer_state_{process_index}.safetensors"
        state = load_file(own if own.is_file() else folder / "trainer_state_0.safetensors")
        counters = [int(v) for v in state["counters"]] + [0, 0]  # earlier checkpoints hold two or three counters
        self.step, self.skipped_steps, self.scaler_overflows, pending = counters[:4]
        self.monitors_pending = bool(pending)
        position = state.get(DATA_POSITION)  # none in a checkpoint written before it was kept
        self.data_position = DataPosition(*map(int, position)) if position is not None else None
        self.since_log.clear()  # the same dict the accumulators hold: what an attempt to load before left goes
        if not own.is_file():
            return
        self.generator.set_state(state["generator"])
        for name, generator in self.other_generators.items():
            generator.set_state(state[f"generator.{name}"])
        self.since_log.update(
            {key.removeprefix(SINCE_LOG): value.to(self.generator.device) for key, value in state.items()
             if key.startswith(SINCE_LOG)}
        )  # fmt: skip
