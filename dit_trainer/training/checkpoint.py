"""Checkpoints: accelerate state (optimizer, LR schedule, RNG, trainer state) plus what trains, and its EMA, in a
format other tools load: the whole DiT as a diffusers ``save_pretrained`` folder, or a LoRA run's adapter in
peft's format (the frozen base is not saved again)."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from accelerate import Accelerator
from diffusers import PixArtTransformer2DModel
from diffusers.training_utils import EMAModel

from dit_trainer.components import trainable_parameters
from dit_trainer.config import ConfigError
from dit_trainer.training.lora import load_adapter, save_adapter

CHECKPOINT_PATTERN = re.compile(r"checkpoint-(\d+)$")
EMA_STATE = "ema_state.json"


@dataclass(frozen=True)
class WeightsFormat:
    """Where and how a checkpoint keeps the trained weights: the raw ones in ``directory``, the EMA ones in
    ``ema_directory``."""

    directory: str
    ema_directory: str
    lora: bool

    def save(self, transformer: PixArtTransformer2DModel, path: Path) -> None:
        if self.lora:
            save_adapter(transformer, path)
        else:
            transformer.save_pretrained(path)

    def load(self, transformer: PixArtTransformer2DModel, path: Path) -> None:
        if self.lora:
            load_adapter(transformer, path)
        else:
            transformer.load_state_dict(PixArtTransformer2DModel.from_pretrained(path).state_dict())

    def weights_dir(self, checkpoint: Path, ema: bool) -> Path:
        """The EMA weights if asked for and saved, else the raw ones."""
        return checkpoint / (
            self.ema_directory if ema and (checkpoint / self.ema_directory).is_dir() else self.directory
        )


FULL_WEIGHTS = WeightsFormat("transformer", "transformer_ema", lora=False)
LORA_WEIGHTS = WeightsFormat("transformer_lora", "transformer_lora_ema", lora=True)


def weights_format(lora: bool) -> WeightsFormat:
    return LORA_WEIGHTS if lora else FULL_WEIGHTS


def is_checkpoint(path: Path) -> bool:
    return any((path / fmt.directory).is_dir() for fmt in (FULL_WEIGHTS, LORA_WEIGHTS))


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
    if not is_checkpoint(path):
        raise ConfigError(
            "trainer.resume",
            spec,
            "it is not a checkpoint folder (one with a `transformer/` or `transformer_lora/` inside)",
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
    """Writes and restores checkpoints through accelerate's hooks (the pattern of diffusers' training examples).

    The EMA weights are saved in the same format as the raw ones (swapped in for the write), with the EMA's
    counters in ``ema_state.json`` beside them.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        checkpoints_dir: Path,
        ema: EMAModel | None,
        total_limit: int | None,
        weights: WeightsFormat = FULL_WEIGHTS,
    ) -> None:
        self.accelerator = accelerator
        self.checkpoints_dir = checkpoints_dir
        self.ema = ema
        self.total_limit = total_limit
        self.weights = weights
        accelerator.register_save_state_pre_hook(self._save_models)
        accelerator.register_load_state_pre_hook(self._load_models)

    def _save_models(self, models: list, weights: list, output_dir: str) -> None:
        if not self.accelerator.is_main_process:
            return
        for model in models:
            transformer = self.accelerator.unwrap_model(model).transformer
            self.weights.save(transformer, Path(output_dir) / self.weights.directory)
            weights.pop()  # saved above; accelerate need not save it again
            if self.ema is not None:
                self._save_ema(transformer, Path(output_dir) / self.weights.ema_directory)

    def _save_ema(self, transformer: PixArtTransformer2DModel, path: Path) -> None:
        parameters = trainable_parameters(transformer)
        self.ema.store(parameters)
        self.ema.copy_to(parameters)
        try:
            self.weights.save(transformer, path)
        finally:
            self.ema.restore(parameters)
        counters = {k: v for k, v in self.ema.state_dict().items() if k != "shadow_params"}
        (path / EMA_STATE).write_text(json.dumps(counters), encoding="utf-8")

    def _load_models(self, models: list, input_dir: str) -> None:
        while models:
            transformer = self.accelerator.unwrap_model(models.pop()).transformer
            if self.ema is not None:
                self._load_ema(transformer, Path(input_dir) / self.weights.ema_directory)
            self.weights.load(transformer, Path(input_dir) / self.weights.directory)

    def _load_ema(self, transformer: PixArtTransformer2DModel, path: Path) -> None:
        """Load the EMA weights into the model to read them out as the EMA's shadow; the raw ones follow."""
        self.weights.load(transformer, path)
        # Checkpoints written by EMAModel.save_pretrained keep the counters in config.json.
        counters = json.loads((path / EMA_STATE if (path / EMA_STATE).is_file() else path / "config.json").read_text())
        shadow = [parameter.detach().clone() for parameter in trainable_parameters(transformer)]
        self.ema.load_state_dict({**counters, "shadow_params": shadow})
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
