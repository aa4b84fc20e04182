"""Build every component from a validated ``TrainConfig`` and run the trainer: the package's entry point."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import DataLoaderConfiguration, DistributedType, ProjectConfiguration, set_seed
from diffusers.optimization import get_scheduler
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, Dataset, IterableDataset

from dit_trainer.components import Components, DiTAdapter, build_components, trainable_parameters
from dit_trainer.components.build import configured_buckets
from dit_trainer.config import MixtureSource, TrainConfig, to_train_config
from dit_trainer.data import build_dataset, collate_batch
from dit_trainer.data.batch_plan import BatchPlan, PlanBatchSampler
from dit_trainer.data.buckets import BucketedStream, BucketTable, bucketed, item_buckets
from dit_trainer.data.cache import CachedPrompts, open_cache
from dit_trainer.data.latent_cache import LatentDataset, encode_dataset
from dit_trainer.data.mixture import item_sources, source_names
from dit_trainer.data.split import split_validation
from dit_trainer.diffusion import SamplerSettings, TextToImage
from dit_trainer.durable import write_text_atomically
from dit_trainer.errors import ConfigError
from dit_trainer.evaluation import validation_reference
from dit_trainer.fid import build_feature_extractor
from dit_trainer.grpo.build import build_policy, build_prompt_sampler, grpo_settings
from dit_trainer.grpo.prompts import PromptSampler
from dit_trainer.grpo.reference import build_reference
from dit_trainer.grpo.trainer import GRPOTrainer
from dit_trainer.precision import resolve_mixed_precision, weight_dtype
from dit_trainer.prompts import load_prompts
from dit_trainer.rewards import build_reward
from dit_trainer.run_folder import CHECKPOINTS, CONFIG, weights_format
from dit_trainer.run_lock import RunFolderLock
from dit_trainer.training.batches import require_full_batches
from dit_trainer.training.checkpoint import Checkpointer, TrainingState, check_run_folder
from dit_trainer.training.data_health import BadFileCounter
from dit_trainer.training.ema import FusedEMA
from dit_trainer.training.fid_monitor import FIDMonitor
from dit_trainer.training.monitors import GRPORewardMonitor, Monitor, MonitorContext, SampleGridMonitor, SamplingPlan
from dit_trainer.training.nonfinite import NonFiniteGuard
from dit_trainer.training.objective import DiffusionObjective
from dit_trainer.training.privacy import PrivateTraining, check_private_launch, make_private
from dit_trainer.training.trackers import start_trackers, tracker_name
from dit_trainer.training.trainer import LoopSettings, Trainer, TrainResult
from dit_trainer.training.update import AccelerateUpdate, PrivateUpdate, Update
from dit_trainer.training.validation import ValidationMonitor, encode_held_out

logger = get_logger(__name__)
SAMPLE_SEEDS_PER_PROMPT = 4


def build_accelerator(cfg: TrainConfig, run_dir: Path) -> Accelerator:
    return Accelerator(
        mixed_precision=resolve_mixed_precision(cfg.trainer.mixed_precision),
        gradient_accumulation_steps=cfg.trainer.gradient_accumulation_steps,
        log_with=tracker_name(cfg.logger),
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )


def refuse_fsdp(accelerator: Accelerator) -> None:
    """FSDP shards the weights that the EMA, the checkpoint hooks and the main-process sampler read whole; until
    that path is built and tested on GPUs, say so rather than fail deep inside the first EMA update."""
    if accelerator.distributed_type == DistributedType.FSDP:
        raise ConfigError(
            "distributed_type",
            "FSDP",
            "this trainer does not support FSDP yet (its EMA, checkpoints and monitors need the full weights on "
            "each rank)",
            "launch with DDP, e.g. `accelerate launch --config_file configs/accelerate/ddp_8gpu.yaml train.py ...`, "
            "which fits DiT-XL/2 (675 M parameters) in bf16 on one 40 GB GPU per rank",
        )


def build_source(cfg: TrainConfig, accelerator: Accelerator) -> tuple[Dataset, CachedPrompts | None, Dataset | None]:
    """The disk cache (and its prompt embeddings) when there is one, else the source data set, less the validation
    images it holds out (returned third); a map-style one is checked to give every process a complete batch before
    any model is built."""
    cache, cached_text = open_cache(cfg, accelerator.device) if cfg.data.cache_dir else (None, None)
    table, source = (cache.table, cache) if cache is not None else (configured_buckets(cfg), build_dataset(cfg.data))
    if cache is None:  # a stream in buckets batches itself, dropping incomplete batches as the loader would
        source = bucketed(source, table, cfg.trainer.batch_size, True, accelerator.is_main_process)
    dataset, held_out = split_validation(cfg.data, cfg.validation, source, table)
    if not isinstance(dataset, IterableDataset):  # a stream's length is unknown: `resumable_batches` checks it
        held = len(held_out) if held_out is not None and cfg.validation.split else 0
        require_full_batches(len(dataset), cfg.trainer.batch_size, accelerator.num_processes, held)
    buckets, sources = item_buckets(dataset), item_sources(dataset)
    if buckets is not None:
        report_buckets(buckets, table, cfg.trainer.batch_size, accelerator.num_processes)
    if sources is not None:
        report_mixture(sources, cfg.data.mixture)
    return dataset, cached_text, held_out


def report_mixture(sources: list[int], mixture: list[MixtureSource]) -> None:
    """Log each source's images and the share of every epoch its weight gives it."""
    counts, total = Counter(sources), sum(entry.weight for entry in mixture)
    described = ", ".join(
        f"{name}: {counts[k]} images, {entry.weight / total:.0%} of each epoch"
        for k, (name, entry) in enumerate(zip(source_names(mixture), mixture))
    )
    logger.info(f"data mixture: {described}", main_process_only=True)


def report_buckets(buckets: list[int], table: BucketTable, batch_size: int, processes: int) -> None:
    """Log how many images each bucket holds, warn about buckets too small for one batch (their images are never
    trained on), and refuse data that fills no batch per process at all."""
    logger.info(f"aspect-ratio buckets (height x width: images): {table.describe(buckets)}", main_process_only=True)
    counts = Counter(buckets)
    small = {bucket: count for bucket, count in counts.items() if count < batch_size}
    if small:
        names = ", ".join(f"{table.sizes[b][0]}x{table.sizes[b][1]} ({n})" for b, n in sorted(small.items()))
        logger.warning(
            f"{sum(small.values())} images sit in buckets smaller than one batch of {batch_size} and are never "
            f"trained on: {names}. Lower `trainer.batch_size` or list fewer buckets in `data.buckets`.",
            main_process_only=True,
        )
    batches = sum(count // batch_size for count in counts.values())
    if batches < processes:
        raise ConfigError(
            "trainer.batch_size",
            batch_size,
            f"the buckets ({table.describe(buckets)}) fill {batches} complete batches of {batch_size}, fewer than "
            f"one per process ({processes})",
            "lower `trainer.batch_size`, list fewer buckets in `data.buckets`, or add data",
        )


def build_training_data(cfg: TrainConfig, accelerator: Accelerator, vae, source: Dataset) -> Dataset:
    """``source``, or with ``data.cache_latents`` its posteriors kept in memory (a disk cache holds them already)."""
    if not cfg.data.cache_latents or cfg.data.cache_dir:
        return source
    return encode_dataset(
        source,
        vae,
        accelerator.device,
        num_workers=cfg.data.num_workers,
        show_progress=accelerator.is_main_process,
    )


def loader_options(cfg: TrainConfig, dataset: Dataset, device: torch.device) -> dict:
    """Worker processes when the items need decoding (an in-memory latent cache does not), pinned memory for
    CUDA, workers kept alive across epochs."""
    workers = 0 if isinstance(dataset, LatentDataset) else cfg.data.num_workers
    return {
        "num_workers": workers,
        "pin_memory": device.type == "cuda",
        "persistent_workers": workers > 0 and not isinstance(dataset, IterableDataset),  # set_epoch reaches workers
        "prefetch_factor": cfg.data.prefetch_factor if workers > 0 else None,
    }


def build_dataloader(cfg: TrainConfig, dataset: Dataset, device: torch.device) -> DataLoader:
    """Map-style data sets are shuffled (in buckets or mixed from several sources, by a seeded plan whose every
    batch is one bucket and whose epochs draw each source by its weight); an iterable one (webdataset) shuffles
    and splits its shards itself."""
    if isinstance(dataset, BucketedStream):  # it yields whole batches
        return DataLoader(dataset, batch_size=None, collate_fn=collate_batch, **loader_options(cfg, dataset, device))
    buckets, sources = item_buckets(dataset), item_sources(dataset)
    if buckets is not None or sources is not None:
        weights = [entry.weight for entry in cfg.data.mixture] or None
        buckets = buckets or [0] * len(dataset)
        plan = BatchPlan(buckets, cfg.trainer.batch_size, cfg.trainer.seed, sources, weights)
        return DataLoader(
            dataset,
            batch_sampler=PlanBatchSampler(plan),
            collate_fn=collate_batch,
            **loader_options(cfg, dataset, device),
        )
    return DataLoader(
        dataset,
        batch_size=cfg.trainer.batch_size,
        shuffle=not isinstance(dataset, IterableDataset),
        drop_last=True,
        collate_fn=collate_batch,
        **loader_options(cfg, dataset, device),
    )


def optimizer_groups(dit: DiTAdapter, weight_decay: float) -> list[dict]:
    """The DiT's trainable parameters in AdamW groups. A learned-variance DiT (2 x latent channels out, as
    pretrained PixArt) has its variance outputs ignored by the loss: their rows of ``proj_out`` get zero gradient,
    so AdamW leaves them as loaded unless weight decay shrinks them. ``proj_out`` is therefore exempt from weight
    decay: the variance half stays frozen, not silently decayed towards zero."""
    named = [(name, p) for name, p in dit.named_parameters() if p.requires_grad]
    config = dit.transformer.config
    if not weight_decay or config.out_channels == config.in_channels:
        return [{"params": [p for _, p in named]}]
    exempt = [p for name, p in named if name.startswith("transformer.proj_out.")]
    rest = [p for name, p in named if not name.startswith("transformer.proj_out.")]
    return [{"params": rest}, {"params": exempt, "weight_decay": 0.0}]


def build_optimizer(cfg: TrainConfig, dit: DiTAdapter) -> torch.optim.Optimizer:
    """AdamW over what trains in ``dit``, with the fused kernel: one kernel for all parameters instead of a loop
    over them."""
    o = cfg.optim
    return torch.optim.AdamW(
        optimizer_groups(dit, o.weight_decay),
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        weight_decay=o.weight_decay,
        fused=True,
    )


def build_monitors(
    cfg: TrainConfig, context: MonitorContext, run_dir: Path, frozen_dtype: torch.dtype
) -> list[Monitor]:
    """The sample grid, and the GRPO reward monitor when ``monitor.grpo.enabled``. Reward models are loaded on
    the main process only: the others never score."""
    d, t, grpo = cfg.diffusion, cfg.trainer, cfg.monitor.grpo
    grid_plan = SamplingPlan(
        list(t.sample_prompts),
        SAMPLE_SEEDS_PER_PROMPT,
        t.sample_seed,
        SamplerSettings(d.sample_steps, d.guidance_scale, d.sampler),
    )
    monitors: list[Monitor] = [SampleGridMonitor(context, grid_plan, run_dir / "samples", t.sample_every)]
    if grpo.enabled:
        accelerator = context.accelerator
        reward = build_reward(cfg.reward, accelerator.device, frozen_dtype) if accelerator.is_main_process else None
        plan = SamplingPlan(
            load_prompts(grpo.prompts, grpo.prompt_file, "monitor.grpo."),
            grpo.group_size,
            grpo.seed,
            SamplerSettings(
                grpo.sample_steps or d.sample_steps,
                d.guidance_scale if grpo.guidance_scale is None else grpo.guidance_scale,
                d.sampler,
            ),
            grpo.batch_size,
        )
        monitors.append(GRPORewardMonitor(context, plan, run_dir / "rewards", grpo.every_n_steps, reward, grpo.eps))
    return monitors


def build_validation_monitor(
    cfg: TrainConfig, context: MonitorContext, parts: Components, held_out: Dataset
) -> ValidationMonitor:
    """The validation loss on ``held_out``, encoded once on the main process (the others never validate)."""
    v, accelerator = cfg.validation, context.accelerator
    batches = None
    if accelerator.is_main_process:
        batches = encode_held_out(held_out, parts.vae, accelerator.device, v.batch_size)
        images = sum(len(batch["caption"]) for batch in batches)
        logger.info(f"validation: {images} held-out images x {v.timesteps} timesteps every {v.every_n_steps} steps")
    return ValidationMonitor(context, v.every_n_steps, batches, parts.text_encoder, parts.schedule, v.timesteps, v.seed)


def build_fid_monitor(cfg: TrainConfig, context: MonitorContext, parts: Components) -> FIDMonitor:
    """FID against the validation images, whose features are computed (or read from their cache) on the main
    process only."""
    f, d, accelerator = cfg.monitor.fid, cfg.diffusion, context.accelerator
    extractor = reference = None
    if accelerator.is_main_process:
        extractor = build_feature_extractor(f.features, f.weights, parts.vae, cfg.vae, accelerator.device)
        reference = validation_reference(cfg, extractor, f.cache_dir, accelerator.device, f.batch_size)
    settings = SamplerSettings(d.sample_steps, d.guidance_scale, d.sampler)
    return FIDMonitor(context, f.every_n_steps, extractor, reference, settings, f.num_images, f.seed, f.batch_size)


def save_resolved_config(cfg: TrainConfig, path: Path) -> None:
    """The config exactly as trained (interpolations resolved): what ``scripts/sample.py`` rebuilds from. Written
    atomically once the run is known to start (a refused resume leaves the previous attempt's file)."""
    write_text_atomically(path, OmegaConf.to_yaml(OmegaConf.structured(cfg)))


def nonfinite_advice(cfg: TrainConfig, accelerator: Accelerator) -> list[str]:
    """The fixes a report of non-finite steps suggests, in this run's config."""
    lr = cfg.optim.lr
    advice = [f"lower the learning rate (`optim.lr={lr:g}` -> e.g. `optim.lr={lr / 10:g}`)"]
    if accelerator.mixed_precision == "fp16":
        advice.append("train in bf16 (`trainer.mixed_precision=bf16`), whose range does not overflow")
    if not cfg.optim.max_grad_norm and not cfg.privacy.enabled:  # under DP, Opacus clips every sample
        advice.append("clip gradients (`optim.max_grad_norm=1.0`)")
    return advice


def loop_settings(cfg: TrainConfig, accelerator: Accelerator) -> LoopSettings:
    t = cfg.trainer
    per_process = cfg.grpo.prompts_per_epoch * cfg.grpo.group_size if cfg.grpo.enabled else t.batch_size
    return LoopSettings(
        max_steps=t.max_steps,
        log_every=t.log_every,
        checkpoint_every=t.checkpoint_every,
        images_per_step=per_process * t.gradient_accumulation_steps * accelerator.num_processes,
        data_path=cfg.data.path,
    )


def start_run(cfg: TrainConfig, run_dir: Path) -> tuple[Accelerator, RunFolderLock | None]:
    """The accelerator of a run, and the lock its main process holds on ``run_dir`` (refused while another run
    holds it, or when the folder has another run's checkpoints)."""
    accelerator = build_accelerator(cfg, run_dir)
    refuse_fsdp(accelerator)
    lock = RunFolderLock(run_dir) if accelerator.is_main_process else None
    if lock is not None:
        lock.acquire()
    try:
        check_run_folder(run_dir, cfg.trainer.resume)
    except ConfigError:
        if lock is not None:
            lock.release()
        raise
    set_seed(cfg.trainer.seed)
    return accelerator, lock


def build_lr_scheduler(
    cfg: TrainConfig, optimizer: torch.optim.Optimizer, accelerator: Accelerator, updates_per_step: int = 1
):
    """The diffusers LR schedule in optimizer updates (a GRPO step makes ``updates_per_step``); accelerate steps it
    once per process, so its lengths count all processes."""
    return get_scheduler(
        cfg.optim.lr_schedule,
        optimizer,
        num_warmup_steps=cfg.optim.warmup_steps * accelerator.num_processes,
        num_training_steps=cfg.trainer.max_steps * updates_per_step * accelerator.num_processes,
    )


def build_ema(cfg: TrainConfig, parameters: list[torch.nn.Parameter], device: torch.device) -> FusedEMA | None:
    """The EMA of what trains (the whole DiT, or a LoRA run's adapters); None with ``trainer.ema_decay=0``."""
    if cfg.trainer.ema_decay == 0:
        return None
    ema = FusedEMA(parameters, decay=cfg.trainer.ema_decay)
    ema.to(device)
    return ema


def build_checkpointer(
    cfg: TrainConfig,
    accelerator: Accelerator,
    run_dir: Path,
    ema: FusedEMA | None,
    privacy: PrivateTraining | None,
    prompt_sampler: PromptSampler | None = None,
) -> Checkpointer:
    """Checkpoints of the run, with the state every step draws its randomness from (one generator per process,
    the DP noise generator and accountant under DP, GRPO's prompt statistics)."""
    generator = torch.Generator(accelerator.device).manual_seed(cfg.trainer.seed + accelerator.process_index)
    state = TrainingState(generator, {"dp_noise": privacy.optimizer.generator} if privacy else None)
    return Checkpointer(
        accelerator,
        run_dir / CHECKPOINTS,
        state,
        ema,
        total_limit=cfg.trainer.checkpoints_total_limit,
        weights=weights_format(cfg.lora.enabled),
        config=dataclasses.asdict(cfg),
        allow_config_change=cfg.trainer.allow_config_change,
        json_states={
            **({"privacy_accountant": privacy} if privacy else {}),
            **({"grpo_prompts": prompt_sampler} if prompt_sampler else {}),
        },
    )


def build_update(
    cfg: TrainConfig,
    accelerator: Accelerator,
    dit: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler,
    parameters: list[torch.nn.Parameter],
    privacy: PrivateTraining | None,
) -> Update:
    """DP-SGD under ``privacy.enabled``, else accelerate's accumulation with clipping to ``optim.max_grad_norm``."""
    if privacy is None:
        accumulation, max_norm = cfg.trainer.gradient_accumulation_steps, cfg.optim.max_grad_norm
        return AccelerateUpdate(accelerator, dit, optimizer, lr_scheduler, parameters, max_norm, accumulation)
    return PrivateUpdate(privacy, accelerator.device, optimizer, lr_scheduler, parameters)


def build_trainer(cfg: TrainConfig, run_dir: str | Path) -> Trainer:
    """Every component built, prepared by accelerate and handed to a ``Trainer`` (resumed if configured). The
    main process holds the run folder's lock until ``fit`` returns."""
    cfg = to_train_config(cfg)
    run_dir = Path(run_dir)
    accelerator, lock = start_run(cfg, run_dir)
    try:
        return assemble_trainer(cfg, run_dir, accelerator, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def assemble_trainer(cfg: TrainConfig, run_dir: Path, accelerator: Accelerator, lock: RunFolderLock | None) -> Trainer:
    """``build_trainer`` once the run folder is held: a ``Trainer`` on the data, or a ``GRPOTrainer`` on rewards."""
    grpo = cfg.grpo.enabled
    source, cached_text, held_out = (None, None, None) if grpo else build_source(cfg, accelerator)
    frozen_dtype = weight_dtype(accelerator.mixed_precision)
    parts = build_components(cfg, accelerator.device, frozen_dtype, cached_text)
    dit = parts.dit
    # The KL anchor is the starting weights: copied before anything trains (and before a resume loads others).
    reference = build_reference(dit, cfg.lora.enabled, accelerator.autocast) if grpo and cfg.grpo.beta > 0 else None
    optimizer = build_optimizer(cfg, dit)
    updates_per_step = cfg.grpo.passes * cfg.grpo.minibatches if grpo else 1
    lr_scheduler = build_lr_scheduler(cfg, optimizer, accelerator, updates_per_step)
    parameters = trainable_parameters(dit.transformer)
    ema = build_ema(cfg, parameters, accelerator.device)
    privacy, dataloader, dataset = None, None, None
    if not grpo:
        dataset = build_training_data(cfg, accelerator, parts.vae, source)
        if cfg.privacy.enabled:  # Poisson batches and the DP optimizer; the loader is Opacus', not accelerate's
            check_private_launch(accelerator)
            privacy, optimizer, dataloader = make_private(
                cfg.privacy,
                dit,
                optimizer,
                dataset,
                batch_size=cfg.trainer.batch_size,
                max_steps=cfg.trainer.max_steps,
                seed=cfg.trainer.seed,
                loader_options=loader_options(cfg, dataset, accelerator.device),
                device=accelerator.device,
            )
            logger.info(privacy.describe(), main_process_only=True)
        else:
            dataloader = build_dataloader(cfg, dataset, accelerator.device)
    dit, optimizer, lr_scheduler = accelerator.prepare(dit, optimizer, lr_scheduler)
    if dataloader is not None and privacy is None and not isinstance(dataset, IterableDataset):
        # Sharded, without device placement: the step moves the tensors it uses (as for the loaders above), so
        # accelerate's per-batch walk through every caption string is not paid. (Streams shard themselves.)
        dataloader = accelerator.prepare_data_loader(dataloader, device_placement=False)
    start_trackers(accelerator, cfg.logger, run_dir, dataclasses.asdict(cfg))

    text_to_image = TextToImage(parts.vae, parts.text_encoder, parts.schedule, parts.latent_shape, accelerator.device)
    context = MonitorContext(accelerator, text_to_image, ema, cfg.logger)
    monitors = build_monitors(cfg, context, run_dir, frozen_dtype)
    if held_out is not None:
        monitors.insert(0, build_validation_monitor(cfg, context, parts, held_out))
    if cfg.monitor.fid.enabled:
        monitors.append(build_fid_monitor(cfg, context, parts))
    update = build_update(cfg, accelerator, dit, optimizer, lr_scheduler, parameters, privacy)
    prompt_sampler = build_prompt_sampler(cfg) if grpo else None
    checkpointer = build_checkpointer(cfg, accelerator, run_dir, ema, privacy, prompt_sampler)
    advice = nonfinite_advice(cfg, accelerator)
    loop = {
        "settings": loop_settings(cfg, accelerator),
        "run_dir": run_dir,
        "accelerator": accelerator,
        "dit": dit,
        "update": update,
        "checkpointer": checkpointer,
        "guard": NonFiniteGuard(
            accelerator, dit, checkpointer.state, cfg.trainer.max_consecutive_nonfinite, advice, update.current_lr
        ),
        "ema": ema,
        "monitors": monitors,
        "num_train_timesteps": parts.schedule.num_train_timesteps,
        "run_lock": lock,
    }
    if grpo:
        trainer = GRPOTrainer(
            **loop,
            grpo=grpo_settings(cfg),
            policy=build_policy(cfg, parts.schedule, accelerator.device),
            vae=parts.vae,
            text_encoder=parts.text_encoder,
            reward=build_reward(cfg.reward, accelerator.device, frozen_dtype),
            latent_shape=parts.latent_shape,
            prompt_sampler=prompt_sampler,
            reference=reference,
        )
    else:
        trainer = Trainer(
            **loop,
            objective=DiffusionObjective(parts.vae, parts.text_encoder, parts.schedule, cfg.data.caption_dropout),
            dataloader=dataloader,
            bad_files=BadFileCounter(
                accelerator, cfg.data.max_bad_fraction, cfg.data.path, source_names(cfg.data.mixture)
            ),
        )
    trainer.resume(cfg.trainer.resume)
    if accelerator.is_main_process:
        save_resolved_config(cfg, run_dir / CONFIG)
    return trainer


def run(cfg: TrainConfig, run_dir: str | Path) -> TrainResult:
    """Train as configured, writing everything into ``run_dir``."""
    return build_trainer(cfg, run_dir).fit()
