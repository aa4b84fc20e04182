"""Writing and restoring checkpoints: accelerate state (optimizer, LR schedule, RNG, data position) plus what
trains, and its EMA, in a format other tools load: the whole DiT as a diffusers ``save_pretrained`` folder, or a
LoRA run's adapter in peft's format (the frozen base is not saved again; ``run_folder.WeightsLayout``).

A checkpoint is written to ``.checkpoint-N.partial`` and renamed to ``checkpoint-N`` only when every file is in
place, with ``manifest.json`` listing them and their sizes; only checkpoints whose manifest matches the disk count,
so a job killed mid-write leaves the previous checkpoint as ``latest``. How it was written (one process, DDP or FSDP)
and what its LR schedule counts are in the manifest too (``checkpoint_manifest``).

How each file is read, and what that means for a checkpoint from elsewhere: the weights (``transformer/``,
``transformer_ema/``, a LoRA run's adapters) and ``trainer_state_N.safetensors`` with safetensors; the manifest,
the EMA's counters and the other states with JSON; a stream's position (``data_stream_N.pt``) and accelerate's
``optimizer.bin``, ``scheduler.bin``, ``random_states_N.pkl`` and ``scaler.pt`` with ``torch.load(weights_only=True)``
(tensors and plain containers, plus numpy's arrays for the RNG states). These cannot run code. An FSDP checkpoint's
sharded folders (``pytorch_model_fsdp_0/``, ``optimizer_0/``, ``ema_sharded/``) are torch.distributed.checkpoint's:
their tensors are read with ``weights_only=True``, but each folder's ``.metadata`` is read with plain ``pickle``
(``FileSystemReader.read_metadata``), and so are the non-tensor values in its ``.distcp`` files (the optimizer's
hyperparameters: ``torch.load(weights_only=False)``). Unpickling runs whatever code the file names: resume an FSDP
checkpoint only from a source you trust, as you would run its code. (A whole-weights checkpoint from elsewhere is
safe to read; to start from someone's FSDP run without that trust, train from its ``transformer/`` weights with
``model.pretrained``.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from accelerate import Accelerator
from accelerate.logging import get_logger
from diffusers import ModelMixin
from diffusers.training_utils import EMAModel
from safetensors import SafetensorError

from dit_trainer.components.freeze import trainable_parameters
from dit_trainer.components.weights import load_weights, save_weights
from dit_trainer.durable import fsync_tree, publish
from dit_trainer.errors import CheckpointWriteError, ConfigError
from dit_trainer.runs.run_folder import (
    MANIFEST,
    WeightsLayout,
    checkpoint_step,
    incomplete_checkpoints,
    list_checkpoints,
    refuse_only_damaged,
    resolve_checkpoint,
    write_kept,
)
from dit_trainer.sharding import reshard
from dit_trainer.training.optim import ConfiguredRates
from dit_trainer.training.state.checkpoint_errors import LOAD_ERRORS, dcp_tracebacks_dropped, load_failure
from dit_trainer.training.state.checkpoint_manifest import (
    ResumeRules,
    WrittenBy,
    check_resumable,
    how_written,
    schedule_in_updates,
)
from dit_trainer.training.state.config_changes import config_hash
from dit_trainer.training.state.saved_state import SavedState, read_saved_state, write_saved_state
from dit_trainer.training.state.training_state import TrainingState

logger = get_logger(__name__)
EMA_STATE = "ema_state.json"
EMA_SLICES = "ema_sharded"  # under FSDP: the EMA's slices as a torch.distributed.checkpoint folder
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)  # what a full disk raises, depending on the writer


class Checkpointer:
    """Writes and restores checkpoints through accelerate's hooks (the pattern of diffusers' training examples).

    The EMA weights are saved in the same format as the raw ones (swapped in for the write), with the EMA's
    counters in ``ema_state.json`` beside them; a checkpoint without them (a run trained without EMA, resumed with
    one) starts the EMA from the restored ``parameters``. ``json_states`` (the DP accountant, a method's own state)
    are saved by the main process (``saved_state``: JSON, or safetensors when they hold tensors);
    ``process_states`` (a stream's position) by every process as ``<name>_<rank>.pt``, and restored only where the
    checkpoint has them (their owner knows what to do without). ``lr_scheduler``'s restored state is converted
    when the checkpoint counted it in processes x updates.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        checkpoints_dir: Path,
        state: TrainingState,
        ema: EMAModel | None,
        total_limit: int | None,
        rules: ResumeRules | None = None,
        json_states: dict[str, SavedState] | None = None,
        process_states: dict[str, SavedState] | None = None,
        lr_scheduler: SavedState | None = None,
        parameters: list[torch.nn.Parameter] | None = None,
        configured: ConfiguredRates | None = None,
    ) -> None:
        self.accelerator = accelerator
        self.checkpoints_dir = checkpoints_dir
        self.state = state
        self.ema = ema
        self.total_limit = total_limit
        # What a checkpoint must share with this run to be resumed; its weights layout and config are what it writes.
        self.rules = rules or ResumeRules()
        self.json_states = json_states or {}
        self.process_states = process_states or {}
        self.lr_scheduler = lr_scheduler
        self.parameters = parameters or []  # what trains, as prepared (under FSDP: this process's slices)
        self.configured = configured  # the optimizer's settings as configured, put back over a checkpoint's
        self.kept: dict[str, int] = {}  # name -> step of a checkpoint kept from pruning (``keep``)
        accelerator.register_save_state_pre_hook(self._save_models)
        accelerator.register_load_state_pre_hook(self._load_models)

    @property
    def weights(self) -> WeightsLayout:
        """What the run trains, and its checkpoints hold: the whole DiT or LoRA adapters (the rules' layout)."""
        return self.rules.weights

    def _save_models(self, models: list, weights: list, output_dir: str) -> None:
        sharded = self.accelerator.is_fsdp2  # whole weights are gathered from every process's slices
        if not (sharded or self.accelerator.is_main_process):
            return
        for model in models:
            reshard(model)  # the EMA swaps the sharded parameters
            transformer = self.accelerator.unwrap_model(model).transformer
            save_weights(transformer, Path(output_dir) / self.weights.directory, self.weights.lora)
            if weights:  # saved above; accelerate need not save it again (under FSDP it saved the slices itself)
                weights.pop()
            if self.ema is not None:
                self._save_ema(transformer, Path(output_dir) / self.weights.ema_directory)
        if sharded and self.ema is not None:  # the slices themselves too: exact, and resharded on a resume
            dcp.save(self._ema_slices(), checkpoint_id=Path(output_dir) / EMA_SLICES)

    def _save_ema(self, transformer: ModelMixin, path: Path) -> None:
        parameters = trainable_parameters(transformer)
        self.ema.store(parameters)
        self.ema.copy_to(parameters)
        try:
            save_weights(transformer, path, self.weights.lora)
        finally:
            self.ema.restore(parameters)
        if self.accelerator.is_main_process:
            counters = {k: v for k, v in self.ema.state_dict().items() if k != "shadow_params"}
            (path / EMA_STATE).write_text(json.dumps(counters), encoding="utf-8")

    def _ema_slices(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"shadow": {str(index): shadow for index, shadow in enumerate(self.ema.shadow_params)}}

    def _load_sharded_ema(self, path: Path) -> None:
        """Under FSDP accelerate loads the model's slices itself (no load hook sees it); the EMA's slices are read
        into the current shadows, resharded to this run's processes."""
        slices = self._ema_slices()
        dcp.load(slices, checkpoint_id=path / EMA_SLICES)
        counters = json.loads((path / self.weights.ema_directory / EMA_STATE).read_text(encoding="utf-8"))
        self.ema.load_state_dict(
            {**counters, "decay": self.ema.decay, "shadow_params": list(slices["shadow"].values())}
        )

    def _load_models(self, models: list, input_dir: str) -> None:
        while models:
            transformer = self.accelerator.unwrap_model(models.pop()).transformer
            if self.ema is not None and self._has_ema(Path(input_dir)):
                self._load_ema(transformer, Path(input_dir) / self.weights.ema_directory)
            load_weights(transformer, Path(input_dir) / self.weights.directory, self.weights.lora)

    def _has_ema(self, path: Path) -> bool:
        """Whether checkpoint ``path`` holds the EMA in the form this run reads (under FSDP: its slices)."""
        return (path / (EMA_SLICES if self.accelerator.is_fsdp2 else self.weights.ema_directory)).is_dir()

    def _start_ema(self, path: Path) -> None:
        """A checkpoint trained without EMA, resumed with one: the EMA starts from the restored weights, as a fresh
        run's starts from its first ones."""
        with torch.no_grad():
            for shadow, parameter in zip(self.ema.shadow_params, self.parameters, strict=True):
                shadow.copy_(parameter.detach())
        logger.warning(
            f"{path.name} holds no EMA weights (that run trained with `trainer.ema_decay=0`): the EMA starts from "
            "its restored weights now, with its warm-up from the start.",
            main_process_only=True,
        )

    def _load_ema(self, transformer: ModelMixin, path: Path) -> None:
        """Load the EMA weights into the model to read them out as the EMA's shadow; the raw ones follow."""
        load_weights(transformer, path, self.weights.lora)
        # Checkpoints written by EMAModel.save_pretrained keep the counters in config.json.
        counters = json.loads((path / EMA_STATE if (path / EMA_STATE).is_file() else path / "config.json").read_text())
        shadow = [parameter.detach().clone() for parameter in trainable_parameters(transformer)]
        self.ema.load_state_dict({**counters, "decay": self.ema.decay, "shadow_params": shadow})  # the configured
        self.ema.to(self.accelerator.device)

    def save(self, step: int) -> Path:
        """Write ``checkpoint-<step>`` atomically and durably (all processes take part); prune old ones after it is
        complete. Any failure to write (a full disk raises ``OSError``, ``RuntimeError`` from ``torch.save`` or
        ``SafetensorError``) becomes a ``CheckpointWriteError``; the main process removes the partial folder (on
        another process's failure the main process may still be writing into it: the next start removes it)."""
        accelerator = self.accelerator
        path = self.checkpoints_dir / f"checkpoint-{step}"
        partial = self.checkpoints_dir / f".checkpoint-{step}.partial"
        replaced = self.checkpoints_dir / f".checkpoint-{step}.replaced"
        accelerator.wait_for_everyone()
        try:
            accelerator.save_state(str(partial))
            self.state.save(partial / f"trainer_state_{accelerator.process_index}.safetensors")
            for name, state in self.process_states.items():
                torch.save(state.state_dict(), partial / f"{name}_{accelerator.process_index}.pt")
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                for name, state in self.json_states.items():
                    write_saved_state(partial, name, state.state_dict())
                self._write_manifest(partial, step)
                fsync_tree(partial)
                if path.exists():  # the same step saved again (resumed from an older checkpoint): set it aside
                    path.rename(replaced)
                publish(partial, path)
                shutil.rmtree(replaced, ignore_errors=True)
        except WRITE_ERRORS as error:
            if accelerator.is_main_process:
                shutil.rmtree(partial, ignore_errors=True)  # give back the space a full disk needs most
            raise CheckpointWriteError(step, partial, error, list_checkpoints(self.checkpoints_dir)) from error
        if accelerator.is_main_process:
            write_kept(self.checkpoints_dir, self.kept)
            kept = set(self.kept.values())
            prunable = [old for old in list_checkpoints(self.checkpoints_dir) if checkpoint_step(old) not in kept]
            for old in prunable[: -self.total_limit] if self.total_limit else []:
                shutil.rmtree(old)
        accelerator.wait_for_everyone()
        return path

    def keep(self, name: str, step: int) -> None:
        """Keep the checkpoint of ``step`` (written next) from pruning under ``name``, in place of the one kept so
        under it before; ``checkpoints/kept.json`` names it for ``checkpoint=<name>``, and the checkpoint's manifest
        records what was kept, so a resume restores the names with the rest."""
        self.kept[name] = step

    def _write_manifest(self, folder: Path, step: int) -> None:
        files = {str(f.relative_to(folder)): f.stat().st_size for f in sorted(folder.rglob("*")) if f.is_file()}
        manifest = {
            "step": step,
            **how_written(self.accelerator),
            "config_hash": config_hash(self.rules.config),
            "config": self.rules.config,
            **({"data_content": self.rules.data_content} if self.rules.data_content is not None else {}),
            **({"base_weights": self.rules.base_weights} if self.rules.base_weights is not None else {}),
            "kept": self.kept,
            "files": files,
        }
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str), encoding="utf-8")

    def restore(self, spec: str | None) -> Path | None:
        """Continue from ``spec``: a checkpoint folder, or ``latest``: the newest complete checkpoint that loads (one
        that does not, whatever the error, is reported and the previous one taken). Returns the checkpoint restored,
        None if none exists. A checkpoint that this launch cannot read (sharded or not), of a world size this run
        cannot change, or of a differently trained model is refused, not fallen back from."""
        if spec is None:
            return None
        if spec == "latest":
            candidates = list_checkpoints(self.checkpoints_dir)[::-1]
            if not candidates:
                refuse_only_damaged(self.checkpoints_dir)
            for path, reason in incomplete_checkpoints(self.checkpoints_dir).items():
                logger.warning(f"{path} is passed over: it is not a complete checkpoint ({reason})")
        else:
            candidates = [resolve_checkpoint(spec, self.checkpoints_dir)]
        failures = []
        for newer, path in zip([None, *candidates], candidates):
            if newer is not None:
                logger.warning(f"{newer} could not be loaded ({failures[-1]}); resuming from {path} instead")
            manifest, written = check_resumable(path, self.rules, self.accelerator)
            failure = self._try_load(path, written)
            if failure is None:
                self.kept = dict(manifest.get("kept", {}))
                return path
            failures.append(failure)
        if failures:
            raise ConfigError(
                "trainer.resume",
                spec,
                "no checkpoint could be loaded, each failing to read a file ("
                + "; ".join(f"{path.name}: {failure}" for path, failure in zip(candidates, failures))
                + ")",
                "restore a checkpoint folder from a copy, or start a fresh run in a new `hydra.run.dir`",
            )
        return None

    def _try_load(self, path: Path, written: WrittenBy) -> str | None:
        """Load ``path`` on every process; None if all did, else why not (the same answer on every process). A
        refusal (``ConfigError``) is raised where it happens: no older checkpoint would do better, and when only one
        process refuses its part (its stream position) the others stop with its message
        (``dit_trainer.runs.failures``)."""
        try:
            with dcp_tracebacks_dropped():
                self._load(path, written)
            failure = None
        except ConfigError:
            raise
        except LOAD_ERRORS as error:  # a damaged file: unreadable, truncated within its size, bit rot
            failure = load_failure(error)
        if self.accelerator.num_processes > 1:
            failed = torch.tensor(float(failure is not None), device=self.accelerator.device)
            if self.accelerator.reduce(failed, reduction="sum").item() and failure is None:
                failure = "another process could not load its part"
        return failure

    def _load(self, path: Path, written: WrittenBy) -> None:
        try:
            self.accelerator.load_state(str(path))
        except (RuntimeError, ValueError) as error:
            # load_state_dict: missing/unexpected keys or size mismatches; the optimizer's: other parameter groups
            weights = "state_dict" in str(error)
            if not weights and "parameter group" not in str(error):
                raise
            raise ConfigError(
                "trainer.resume",
                str(path),
                f"its {'weights do' if weights else 'optimizer state does'} not fit the configured "
                f"{'model' if weights else 'optimizer'} ({' '.join(str(error).split())[:300]})",
                "resume with the settings that run was trained with (its config.yaml; `optim.weight_decay` on a "
                "learned-variance model decides the optimizer's parameter groups), or start a fresh run in a new "
                "`hydra.run.dir`",
            ) from error
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(schedule_in_updates(self.lr_scheduler.state_dict(), written))
        if self.configured is not None:
            self.configured.reapply()
        if self.ema is not None and not self._has_ema(path):
            self._start_ema(path)
        elif self.accelerator.is_fsdp2 and self.ema is not None:
            self._load_sharded_ema(path)
        self.state.load(path, self.accelerator.process_index)
        for name, state in self.process_states.items():
            file = path / f"{name}_{self.accelerator.process_index}.pt"
            if file.is_file():
                state.load_state_dict(torch.load(file, weights_only=True))
        for name, state in self.json_states.items():
            saved = read_saved_state(path, name)
            if saved is None:
                raise ConfigError(
                    "trainer.resume",
                    str(path),
                    f"this run needs its {name} state, and the checkpoint has no {name}.json or {name}.safetensors "
                    "(it was written by a run configured differently)",
                    "resume with the settings that run was trained with (its config.yaml)",
                )
            state.load_state_dict(saved)
