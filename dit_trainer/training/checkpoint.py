"""Checkpoints: accelerate state (optimizer, LR schedule, RNG, trainer state) plus the DiT and its EMA in
diffusers ``save_pretrained`` format, so a checkpoint folder is directly loadable by diffusers."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from accelerate import Accelerator
from diffusers import PixArtTransformer2DModel
from diffusers.training_utils import EMAModel

from dit_trainer.config import ConfigError

CHECKPOINT_PATTERN = re.compile(r"checkpoint-(\d+)$")
TRANSFORMER_DIR = "transformer"
EMA_DIR = "transformer_ema"


def checkpoint_step(path: Path) -> int:
    match = CHECKPOINT_PATTERN.search(path.name)
    if match is None:
        raise ValueError(f"{path} is not named checkpoint-<step>")
    return int(match.group(1))


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Checkpoint folders, oldest first."""
    if not checkpoints_dir.is_dir():
        return []
    found = [p for p in checkpoints_dir.iterdir() if p.is_dir() and CHECKPOINT_PATTERN.search(p.name)]
    return sorted(found, key=checkpoint_step)


def resolve_checkpoint(spec: str | None, checkpoints_dir: Path) -> Path | None:
    """``latest`` -> the newest checkpoint in ``checkpoints_dir`` (None if there is none); a path -> that folder."""
    if spec is None:
        return None
    if spec == "latest":
        found = list_checkpoints(checkpoints_dir)
        return found[-1] if found else None
    path = Path(spec).expanduser()
    if not (path.is_dir() and (path / TRANSFORMER_DIR).is_dir()):
        raise ConfigError(
            "trainer.resume",
            spec,
            "it is not a checkpoint folder (one with a `transformer/` inside)",
            f"use `trainer.resume=latest` or a folder such as {checkpoints_dir}/checkpoint-1000",
        )
    return path


def check_run_folder(run_dir: Path, resume: str | None) -> None:
    """Refuse to start a fresh run over the checkpoints of another: they would be mixed, then pruned."""
    existing = list_checkpoints(run_dir / "checkpoints")
    if resume is None and existing:
        raise ConfigError(
            "trainer.resume",
            resume,
            f"the run folder {run_dir} already holds checkpoints (newest: {existing[-1].name}) and a fresh run "
            "would mix with them",
            "continue that run with `trainer.resume=latest`, or start a new one in a fresh `hydra.run.dir`",
        )


class Checkpointer:
    """Writes and restores checkpoints through accelerate's hooks (the pattern of diffusers' training examples)."""

    def __init__(
        self, accelerator: Accelerator, checkpoints_dir: Path, ema: EMAModel | None, total_limit: int | None
    ) -> None:
        self.accelerator = accelerator
        self.checkpoints_dir = checkpoints_dir
        self.ema = ema
        self.total_limit = total_limit
        accelerator.register_save_state_pre_hook(self._save_models)
        accelerator.register_load_state_pre_hook(self._load_models)

    def _save_models(self, models: list, weights: list, output_dir: str) -> None:
        if not self.accelerator.is_main_process:
            return
        for model in models:
            self.accelerator.unwrap_model(model).transformer.save_pretrained(Path(output_dir) / TRANSFORMER_DIR)
            weights.pop()  # saved above in diffusers format; accelerate need not save it again
        if self.ema is not None:
            self.ema.save_pretrained(Path(output_dir) / EMA_DIR)

    def _load_models(self, models: list, input_dir: str) -> None:
        while models:
            model = self.accelerator.unwrap_model(models.pop())
            saved = PixArtTransformer2DModel.from_pretrained(Path(input_dir) / TRANSFORMER_DIR)
            model.transformer.load_state_dict(saved.state_dict())
        if self.ema is not None:
            saved_ema = EMAModel.from_pretrained(Path(input_dir) / EMA_DIR, PixArtTransformer2DModel)
            self.ema.load_state_dict(saved_ema.state_dict())
            self.ema.to(self.accelerator.device)

    def save(self, step: int) -> Path:
        path = self.checkpoints_dir / f"checkpoint-{step}"
        self.accelerator.save_state(str(path))
        if self.accelerator.is_main_process and self.total_limit:
            for old in list_checkpoints(self.checkpoints_dir)[: -self.total_limit]:
                shutil.rmtree(old)
        return path

    def load(self, path: Path) -> int:
        """Restore everything from ``path``; returns its step."""
        self.accelerator.load_state(str(path))
        return checkpoint_step(path)
