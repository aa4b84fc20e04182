"""The composition root: a validated ``TrainConfig`` in, a ready ``Trainer`` out. It starts the accelerator and
takes the run folder's lock, derives the run's plan once (``RunPlan``: the image sizes the models allow, what a step
is), has each part built by its own module from its own sections (data: ``data.loading``; models:
``components.build``; optimizer, LR and EMA: ``training.optim``; monitors: ``training.monitors.monitor_set``; the step:
the method ``trainer.method`` names, ``methods``), and wires them with the update strategy, the checkpointer and the
non-finite guard. It asks the method what it needs (a data set or none, updates per step) and never names one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import (
    set_seed,
)
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, Dataset, IterableDataset

from dit_trainer.components.build import Components, build_components
from dit_trainer.components.compile import apply_compile
from dit_trainer.components.fp8 import apply_fp8
from dit_trainer.components.freeze import trainable_parameters
from dit_trainer.components.geometry import configured_buckets
from dit_trainer.components.lora import base_weights
from dit_trainer.config import TrainConfig, TrainerConfig, call_with_sections
from dit_trainer.data.bad_files import BadFileCounter
from dit_trainer.data.buckets import BucketTable
from dit_trainer.data.cache.cache import CacheDataset, open_cache
from dit_trainer.data.cache.cached_prompts import CachedPrompts
from dit_trainer.data.cache.fingerprint import cache_fingerprint
from dit_trainer.data.loading import build_dataloader, build_source, build_training_data, loader_options
from dit_trainer.data.sources.source import trained_content
from dit_trainer.data.stream_loader import StreamLoader
from dit_trainer.diffusion.sampler import TextToImage
from dit_trainer.durable import write_text_atomically
from dit_trainer.errors import ConfigError
from dit_trainer.methods import method_of
from dit_trainer.methods.base import Method
from dit_trainer.precision import allow_tf32, weight_dtype
from dit_trainer.prompts import reward_monitor_prompts, sampled_prompts
from dit_trainer.runs.init_run import own_starting_weights
from dit_trainer.runs.run_folder import (
    CHECKPOINTS,
    CONFIG,
    IMAGE_SIZES,
    check_run_folder,
    remove_unfinished_writes,
    weights_layout,
)
from dit_trainer.runs.run_lock import RunFolderLock, lock_for_run
from dit_trainer.training.banner import log_start_banner
from dit_trainer.training.launch import build_accelerator
from dit_trainer.training.monitors.monitor_set import build_monitor_set
from dit_trainer.training.monitors.monitors import MonitorContext
from dit_trainer.training.monitors.text_cost import warn_live_text_encoding
from dit_trainer.training.monitors.tracker_media import Trackers
from dit_trainer.training.monitors.trackers import start_trackers
from dit_trainer.training.nonfinite import NonFiniteGuard, nonfinite_advice
from dit_trainer.training.optim import (
    ConfiguredRates,
    build_ema,
    build_lr_scheduler,
    build_optimizer,
    warmup_within_run,
)
from dit_trainer.training.optimizers import check_sharded_optimizer
from dit_trainer.training.parallel.fsdp import (
    check_fsdp,
    gather_shared_modules_once,
    wrap_family_blocks,
)
from dit_trainer.training.parallel.memory import report_memory
from dit_trainer.training.parallel.privacy import PrivateTraining, check_private_launch, make_private
from dit_trainer.training.shapes_vae import warn_shapes_vae_on_other_data
from dit_trainer.training.state.checkpoint import Checkpointer
from dit_trainer.training.state.checkpoint_manifest import (
    ResumeRules,
    check_resume_before_models,
    check_resume_launch,
)
from dit_trainer.training.state.ema import FusedEMA
from dit_trainer.training.state.saved_state import SavedState
from dit_trainer.training.state.training_state import TrainingState
from dit_trainer.training.step import StepParts, UpdateSequence
from dit_trainer.training.trainer import LoopSettings, Trainer, TrainResult
from dit_trainer.training.update import Update, build_update

logger = get_logger(__name__)


def start_run(cfg: TrainConfig, run_dir: Path) -> tuple[Accelerator, RunFolderLock | None]:
    """The accelerator of a run, and the lock its main process holds on ``run_dir`` (refused while another run
    holds it, or when the folder has another run's checkpoints). What unfinished checkpoint writes left is cleared
    here, and a checkpoint to resume that this launch cannot read (sharded or not) is refused before any model is
    built."""
    accelerator = build_accelerator(cfg.trainer, cfg.logger, run_dir)
    check_fsdp(accelerator)
    check_sharded_optimizer(cfg.optim, accelerator.is_fsdp2)
    lock = lock_for_run(run_dir) if accelerator.is_main_process else None
    try:
        if accelerator.is_main_process:
            remove_unfinished_writes(run_dir / CHECKPOINTS)
        accelerator.wait_for_everyone()  # every process then reads the checkpoints as the main process left them
        check_run_folder(run_dir, cfg.trainer.resume)
        check_resume_launch(run_dir / CHECKPOINTS, cfg.trainer.resume, accelerator)
    except ConfigError:
        if lock is not None:
            lock.release()
        raise
    set_seed(cfg.trainer.seed)
    allow_tf32(accelerator.device)
    return accelerator, lock


def save_resolved_config(cfg: TrainConfig, path: Path) -> None:
    """The config exactly as trained (interpolations resolved): what ``scripts/sample.py`` rebuilds from. Written
    atomically once the run is known to start (a refused resume leaves the previous attempt's file)."""
    write_text_atomically(path, OmegaConf.to_yaml(OmegaConf.structured(cfg)))


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What a run derives from its config once, before anything is built, and hands to the parts that need it (each
    part otherwise gets its own sections): the image sizes the models allow, what one step is, and the prompts the
    monitors sample (which a disk cache must hold embedded)."""

    buckets: BucketTable | None  # `data.buckets` on the models' patch grid (None: squares, or no data set read)
    updates_per_step: int  # the optimizer updates a step makes (an online method's epoch makes several)
    images_per_step: int  # the images a step trains on, over processes and accumulation (the loop's images/s)
    reward_prompts: tuple[str, ...]  # the reward monitor's prompts (none while it is off)
    sampled_prompts: tuple[str, ...]  # every prompt the run samples or drops captions to: "", the grid's, the above


def plan_run(cfg: TrainConfig, method: Method, processes: int) -> RunPlan:
    per_process = method.ask(method.images_per_step, cfg) * cfg.trainer.gradient_accumulation_steps
    reward_prompts = reward_monitor_prompts(cfg.monitor.reward)
    return RunPlan(
        buckets=configured_buckets(cfg.model, cfg.vae, cfg.data) if method.reads_data else None,
        updates_per_step=method.ask(method.updates_per_step, cfg),
        images_per_step=per_process * processes,
        reward_prompts=tuple(reward_prompts),
        sampled_prompts=tuple(sampled_prompts(cfg.trainer.sample_prompts, reward_prompts)),
    )


def open_run_cache(
    cfg: TrainConfig, plan: RunPlan, device: torch.device
) -> tuple[CacheDataset, CachedPrompts] | tuple[None, None]:
    """The disk cache at ``data.cache_dir`` (none configured: None, None), checked against the settings of the VAE,
    the text encoder and the data, the plan's buckets, and the prompts the run samples."""
    if not cfg.data.cache_dir:
        return None, None
    fingerprint = cache_fingerprint(cfg.data, cfg.vae, cfg.conditioner, plan.buckets)
    return open_cache(cfg.data.cache_dir, fingerprint, plan.sampled_prompts, device)


def loop_settings(trainer: TrainerConfig, plan: RunPlan) -> LoopSettings:
    return LoopSettings(
        max_steps=trainer.max_steps,
        log_every=trainer.log_every,
        checkpoint_every=trainer.checkpoint_every,
        images_per_step=plan.images_per_step,
    )


def build_training_state(cfg: TrainConfig, accelerator: Accelerator, privacy: PrivateTraining | None) -> TrainingState:
    """The step count and the generators every step draws its randomness from: one per process, and DP's noise."""
    generator = torch.Generator(accelerator.device).manual_seed(cfg.trainer.seed + accelerator.process_index)
    return TrainingState(generator, privacy.generators() if privacy else None)


def build_checkpointer(
    cfg: TrainConfig,
    accelerator: Accelerator,
    run_dir: Path,
    state: TrainingState,
    update: Update,
    ema: FusedEMA | None,
    privacy: PrivateTraining | None,
    rules: ResumeRules,
    method_states: dict[str, SavedState],
    dataloader: DataLoader | None = None,
    bad_files: BadFileCounter | None = None,
) -> Checkpointer:
    """Checkpoints of the run: its ``state``, DP's accountant, the method's own ``method_states``, the ``update``'s
    LR schedule and trained parameters (a resume converts a schedule counted in processes, and starts an EMA the
    checkpoint lacks), and per process a stream's position and the unreadable files counted; resumed under
    ``rules``."""
    process_states = dataloader.process_states() if isinstance(dataloader, StreamLoader) else {}
    return Checkpointer(
        accelerator,
        run_dir / CHECKPOINTS,
        state,
        ema,
        total_limit=cfg.trainer.checkpoints_total_limit,
        rules=rules,
        json_states={**(privacy.saved_states() if privacy else {}), **method_states},
        process_states=process_states | ({"bad_files": bad_files} if bad_files else {}),
        lr_scheduler=update.lr_scheduler,
        parameters=update.parameters,
        configured=ConfiguredRates(update.optimizer, update.lr_scheduler),
    )


def resume_rules(cfg: TrainConfig, method: Method, source: Dataset | None) -> ResumeRules:
    """What a checkpoint must share with this run (``cfg`` as trained: checked, recorded) to be resumed by it;
    ``source``: what it trains on (None: a method that reads no data)."""
    return ResumeRules(
        weights=weights_layout(cfg.lora.enabled),
        config=dataclasses.asdict(cfg),
        allow_config_change=cfg.trainer.allow_config_change,
        same_processes_because=why_resume_needs_same_processes(
            cfg.privacy.enabled, streamed=isinstance(source, IterableDataset)
        ),
        method_sections=method_sections(method),
        data_content=trained_content(cfg.data) if source is not None else None,
        base_weights=base_weights(cfg.model, cfg.lora),
    )


def method_sections(method: Method) -> tuple[str, ...]:
    """The config sections ``method`` trains by: its own, and the rewards when it trains on them."""
    return (*([method.section] if method.section else []), *(["reward"] if method.scores_rewards else []))


def why_resume_needs_same_processes(private: bool, streamed: bool) -> str | None:
    """What a checkpoint of this run holds per process and cannot split or merge (None: weights and optimizer
    state reshard, and a shuffled data set's position is counted in images)."""
    if private:
        return "DP-SGD's privacy accounting assumes the Poisson sampling of one process throughout"
    if streamed:
        return "a streamed source resumes from the shard position each process recorded"
    return None


def build_training_loader(
    cfg: TrainConfig, accelerator: Accelerator, parts: Components, source: Dataset, optimizer: torch.optim.Optimizer
) -> tuple[PrivateTraining | None, torch.optim.Optimizer, DataLoader]:
    """The loader of what is trained on (``source``, or its latents cached in memory); under ``privacy.enabled`` a
    Poisson-sampled one and the DP optimizer (the loader is Opacus', not accelerate's)."""
    dataset = build_training_data(cfg.data, accelerator, parts.vae, source)
    if not cfg.privacy.enabled:
        return None, optimizer, build_dataloader(cfg.data, cfg.trainer, dataset, accelerator.device)
    check_private_launch(accelerator)
    privacy, optimizer, dataloader = make_private(
        cfg.privacy,
        parts.dit,
        optimizer,
        dataset,
        batch_size=cfg.trainer.batch_size,
        max_steps=cfg.trainer.max_steps,
        seed=cfg.trainer.seed,
        loader_options=loader_options(cfg.data, dataset, accelerator.device),
        device=accelerator.device,
    )
    logger.info(privacy.describe(), main_process_only=True)
    return privacy, optimizer, dataloader


def build_trainer(cfg: TrainConfig, run_dir: str | Path) -> Trainer:
    """Every component of a run with a validated ``cfg`` (``run_config.to_train_config``) built, prepared by
    accelerate and handed to a ``Trainer`` (resumed if configured). The main process holds the run folder's lock
    until ``fit`` returns or the trainer is closed (``Trainer.close``, or ``with build_trainer(...) as trainer:``)."""
    run_dir = Path(run_dir)
    accelerator, lock = start_run(cfg, run_dir)
    try:
        return assemble_trainer(cfg, run_dir, accelerator, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def assemble_trainer(cfg: TrainConfig, run_dir: Path, accelerator: Accelerator, lock: RunFolderLock | None) -> Trainer:
    """``build_trainer`` once the run folder is held: a ``Trainer`` running the step of ``trainer.method``, on the
    data set when the method reads one."""
    method = method_of(cfg.trainer)
    if cfg.trainer.init_weights:  # started from another run: its weights are copied here first
        cfg = own_starting_weights(cfg, run_dir, accelerator)
    plan = plan_run(cfg, method, accelerator.num_processes)
    updates = cfg.trainer.max_steps * plan.updates_per_step
    # A warm-up as long as the run is cut (and recorded so).
    cfg = dataclasses.replace(cfg, optim=warmup_within_run(cfg.optim, cfg.trainer.max_steps, plan.updates_per_step))
    reads_data = method.reads_data
    source = held_out = cached_text = None
    if reads_data:  # the data's own problems are found before any model loads
        cache, cached_text = open_run_cache(cfg, plan, accelerator.device)
        batch_size, seed, sizes_dir = cfg.trainer.batch_size, cfg.trainer.seed, run_dir / IMAGE_SIZES
        source, held_out = build_source(
            cfg.data, cfg.validation, batch_size, seed, plan.buckets, cache, accelerator, sizes_dir
        )
    rules = resume_rules(cfg, method, source)
    check_resume_before_models(run_dir / CHECKPOINTS, cfg.trainer.resume, rules, accelerator, cfg.trainer.max_steps)
    frozen_dtype = weight_dtype(accelerator.mixed_precision)
    parts = build_components(
        model=cfg.model,
        vae=cfg.vae,
        conditioner=cfg.conditioner,
        data=cfg.data,
        diffusion=cfg.diffusion,
        lora=cfg.lora,
        privacy=cfg.privacy,
        trainer=cfg.trainer,
        device=accelerator.device,
        frozen_dtype=frozen_dtype,
        cached_text=cached_text,
    )
    # A hub base downloaded just now is fingerprinted now.
    rules = dataclasses.replace(rules, base_weights=base_weights(cfg.model, cfg.lora))
    # Logged; on a GPU, a run whose `trainer.batch_size` steps cannot fit is refused before step 1.
    report_memory(cfg.trainer, cfg.optim.name, parts, accelerator, refuse_unfit=reads_data)
    if reads_data:
        # When encoding captions every step costs much of the DiT's step; the shipped VAE knows only the shapes.
        warn_live_text_encoding(cfg.conditioner, cfg.trainer.batch_size, parts)
        warn_shapes_vae_on_other_data(cfg.vae, cfg.data)
    apply_fp8(cfg.precision, parts.dit, accelerator.device)  # precision.fp8: before compile fuses its casts
    # trainer.compile: after the meta-device counts above, before prepare wraps
    apply_compile(parts.dit, cfg.trainer.compile, bucketed=cfg.data.buckets != "none")
    optimizer = build_optimizer(cfg.optim, parts.dit)
    lr_scheduler = build_lr_scheduler(cfg.optim, optimizer, updates)
    privacy = dataloader = None
    if reads_data:
        privacy, optimizer, dataloader = build_training_loader(cfg, accelerator, parts, source, optimizer)
    wrap_family_blocks(accelerator, parts.dit)
    dit, optimizer, lr_scheduler = accelerator.prepare(parts.dit, optimizer, lr_scheduler)
    gather_shared_modules_once(accelerator.unwrap_model(dit))  # the DiT's embedder: one all-gather a step
    # Taken after prepare: FSDP2 replaces every parameter with a sharded one (the EMA then holds slices too).
    parameters = trainable_parameters(accelerator.unwrap_model(dit).transformer)
    ema = build_ema(cfg.trainer.ema_decay, parameters)
    if dataloader is not None and privacy is None and not isinstance(dataloader.dataset, IterableDataset):
        # Sharded, without device placement: the step moves the tensors it uses (as for the loaders above), so
        # accelerate's per-batch walk through every caption string is not paid. (Streams shard themselves.)
        dataloader = accelerator.prepare_data_loader(dataloader, device_placement=False)
    start_trackers(accelerator, cfg.logger, run_dir, dataclasses.asdict(cfg))

    text_to_image = TextToImage(parts.vae, parts.text_encoder, parts.schedule, parts.latent_shape, accelerator.device)
    trackers = Trackers(accelerator, cfg.logger, weights_layout(cfg.lora.enabled))
    context = MonitorContext(accelerator, text_to_image, ema, trackers, sharded=accelerator.is_fsdp2)
    monitors = call_with_sections(
        build_monitor_set,
        cfg,
        context=context,
        run_dir=run_dir,
        frozen_dtype=frozen_dtype,
        parts=parts,
        held_out=held_out,
        reward_prompts=plan.reward_prompts,
    )
    update = build_update(cfg.trainer, cfg.optim, accelerator, dit, optimizer, lr_scheduler, parameters, privacy)
    state = build_training_state(cfg, accelerator, privacy)
    advice = nonfinite_advice(cfg.optim, cfg.privacy, accelerator.mixed_precision)
    guard = NonFiniteGuard(accelerator, dit, state, cfg.trainer.max_consecutive_nonfinite, advice, update.current_lr)
    loop = StepParts(accelerator, dit, state, UpdateSequence(update, guard, ema))
    bad_files = BadFileCounter.of(cfg.data, accelerator) if reads_data else None
    given = dict(loop=loop, parts=parts, frozen_dtype=frozen_dtype, dataloader=dataloader, bad_files=bad_files)
    step = method.ask(method.build_step, cfg, **given)
    monitors += method.ask(
        method.build_monitors, cfg, context=context, run_dir=run_dir, step=step, frozen_dtype=frozen_dtype
    )
    saved_states = step.saved_states() | {name: s for m in monitors for name, s in m.saved_states().items()}
    checkpointer = build_checkpointer(
        cfg, accelerator, run_dir, state, update, ema, privacy, rules, saved_states, dataloader, bad_files
    )
    trainer = Trainer(
        settings=loop_settings(cfg.trainer, plan),
        run_dir=run_dir,
        accelerator=accelerator,
        dit=dit,
        update=update,
        checkpointer=checkpointer,
        guard=guard,
        step=step,
        ema=ema,
        monitors=monitors,
        run_lock=lock,
        trackers=trackers,
    )
    trainer.resume(cfg.trainer.resume)
    if accelerator.is_main_process:
        save_resolved_config(cfg, run_dir / CONFIG)
    inputs = method.ask(method.describe_inputs, cfg)
    call_with_sections(log_start_banner, cfg, run=trainer, dataset=source, held_out=held_out, inputs=inputs)
    return trainer


def run(cfg: TrainConfig, run_dir: str | Path) -> TrainResult:
    """Train as configured (``cfg`` validated by ``run_config.to_train_config``), writing everything into
    ``run_dir``."""
    return build_trainer(cfg, run_dir).fit()
