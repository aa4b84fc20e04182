"""What the rest of the package asks of a training method.

The defaults are those of a method that trains on the data set's batches, one optimizer update per step; a method
overrides what differs. ``build_step`` is the one thing every method defines. Nothing here imports torch: the
registry's names and a method's ``check`` run while a config is being validated, before any model library loads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from dit_trainer.config import call_with_sections

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from torch.utils.data import DataLoader

    from dit_trainer.components.build import Components
    from dit_trainer.config import TrainerConfig
    from dit_trainer.data.bad_files import BadFileCounter
    from dit_trainer.training.monitors.monitors import Monitor, MonitorContext
    from dit_trainer.training.step import StepParts, TrainingStep

Answer = TypeVar("Answer")


class Method:
    """A training method: its name in ``trainer.method``, and its answers to the composition root, the config
    checks, the start banner and the model card.

    Each answer is asked through ``ask``, which hands it what its parameters name: the config sections by their
    keys (``trainer: TrainerConfig``), and the caller's objects by the names the base answers below take. An answer
    reads no section it does not name. One that needs a module with torch may be a property that imports its
    function when asked (that function's parameters are then the ones named)."""

    name: str = ""
    section: str | None = None  # the config section it owns (`grpo`): read by its own modules, by no other
    # It trains on batches of the data set: the data checks, the loader, DP-SGD, validation and the warnings about
    # the cost of encoding captions apply. A method that makes its own inputs (rollouts) reads no data.
    reads_data: bool = True
    scores_rewards: bool = False  # it trains on rewards: the configured ones must load (checked before the run)
    card_tag: str | None = None  # the model card's tag for a model trained this way (the default method has none)

    def ask(self, answer: Callable[..., Answer], config: Any, **given: Any) -> Answer:
        """``answer`` (one of this method's) called with the sections of ``config`` it names and what it names of
        ``given``; a method's answers may name its own section by a role (``section_roles``)."""
        return call_with_sections(answer, config, self.section_roles(), **given)

    def section_roles(self) -> dict[str, str]:
        """Parameter names by which this method's answers read a section of another key (a method shared by several
        sections of one type names each by its role)."""
        return {}

    def checks(self) -> list[Callable[..., None]]:
        """What refuses, with one ``ConfigError`` paragraph, what this method cannot train (its own section, and what
        it needs of the others), in order; each asked after the field checks, before any model loads. By default
        the method's own ``check``."""
        return [self.check]

    def check(self) -> None:
        """This method's own rules (none)."""

    def updates_per_step(self) -> int:
        """Optimizer updates in one step of the loop: what the LR schedule counts in."""
        return 1

    def images_per_step(self, trainer: TrainerConfig) -> int:
        """Images one process trains on per optimizer-update window (before gradient accumulation)."""
        return trainer.batch_size

    def describe_inputs(self) -> str | None:
        """What the start banner says this method trains on, when that is not the data set."""
        return None

    def describe(self) -> str:
        """The method as the model card names it."""
        return self.name

    def build_step(
        self,
        loop: StepParts,
        parts: Components,
        frozen_dtype: torch.dtype,
        dataloader: DataLoader | None,
        bad_files: BadFileCounter | None,
    ) -> TrainingStep:
        """The step the ``Trainer`` runs, on the prepared ``loop`` parts and the built models (``parts``);
        ``dataloader`` is the prepared loader of the data set when ``reads_data``, else None, and ``bad_files`` the
        count of its unreadable files that the step adds each batch to (checkpointed with the run). Called after
        ``accelerator.prepare`` and before a resume loads a checkpoint."""
        raise NotImplementedError(f"the method {self.name!r} defines no build_step")

    def build_monitors(
        self, context: MonitorContext, run_dir: Path, step: TrainingStep, frozen_dtype: torch.dtype
    ) -> list[Monitor]:
        """The method's own monitors (the online methods' gold-reward watch), run after the run's; built once the
        ``step`` is, so they may share its models."""
        return []
