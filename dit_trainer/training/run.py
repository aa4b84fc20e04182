"""Build every component from a validated ``TrainConfig`` and run the trainer: the package's entry point."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedType, ProjectConfiguration, set_seed
from diffusers.optimization import get_scheduler
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, Dataset, IterableDataset

from dit_trainer.components import (
    DiTAdapter,
    build_dit,
    build_text_encoder,
    build_vae,
    enable_gradient_checkpointing,
    expose_modulation_tables,
    trainable_parameters,
)
from dit_trainer.config import ConfigError, TrainConfig, load_prompts, validate
from dit_trainer.data import build_dataset, collate_batch
from dit_trainer.data.cache import CacheDataset, CachedPrompts, open_cache
from dit_trainer.data.latent_cache import LatentDataset, encode_dataset
from dit_trainer.diffusion.sampler import SamplerSettings, TextToImage
from dit_trainer.diffusion.schedule import NoiseSchedule, build_noise_schedule
from dit_trainer.rewards import build_reward
from dit_trainer.training.checkpoint import check_run_folder
from dit_trainer.training.ema import FusedEMA
from dit_trainer.training.lora import apply_lora
from dit_trainer.training.monitors import (
    GRPORewardMonitor,
    Monitor,
    MonitorContext,
    SampleGridMonitor,
    SamplingPlan,
)
from dit_trainer.training.precision import resolve_mixed_precision, weight_dtype
from dit_trainer.training.privacy import check_private_launch, make_private
from dit_trainer.training.trackers import start_trackers, tracker_name
from dit_trainer.training.trainer import Trainer, TrainResult

SAMPLE_SEEDS_PER_PROMPT = 4


@dataclass
class Components:
    """The built models and schedule of a run: what a training step and a sampler need."""

    vae: torch.nn.Module
    text_encoder: torch.nn.Module
    dit: DiTAdapter
    schedule: NoiseSchedule
    latent_shape: tuple[int, int, int]


def build_components(
    cfg: TrainConfig, device: torch.device, frozen_dtype: torch.dtype, cached_text: CachedPrompts | None = None
) -> Components:
    """Frozen VAE and text encoder on ``device`` in ``frozen_dtype``; the DiT (float32 master weights) sized by
    the VAE's latent channels, the resolution, and the text encoder's hidden size. Training from a cache passes
    its ``cached_text`` embeddings: the text encoder is then not loaded and the VAE keeps only its decoder."""
    vae = build_vae(cfg.vae, device, frozen_dtype)
    if cached_text is not None:
        vae.drop_encoder()
    text_encoder = cached_text or build_text_encoder(cfg.text_encoder, device, frozen_dtype)
    latent_size = cfg.data.resolution // vae.downsample_factor
    dit = build_dit(cfg.model, vae.latent_channels, latent_size, text_encoder.hidden_size)
    if cfg.lora.enabled:
        apply_lora(dit.transformer, cfg.lora)
    if cfg.privacy.enabled:  # before the optimizer and EMA collect the parameters: their order changes
        expose_modulation_tables(dit.transformer)
    if cfg.trainer.gradient_checkpointing:
        enable_gradient_checkpointing(dit, cfg.trainer.reentrant_checkpointing)
    schedule = build_noise_schedule(cfg.diffusion)
    return Components(vae, text_encoder, dit, schedule, (vae.latent_channels, latent_size, latent_size))


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


def build_training_data(cfg: TrainConfig, accelerator: Accelerator, vae, cache: CacheDataset | None) -> Dataset:
    """The disk cache when there is one; else the source data set, its posteriors kept in memory with
    ``data.cache_latents``."""
    if cache is not None:
        return cache
    dataset = build_dataset(cfg.data)
    if cfg.data.cache_latents:
        return encode_dataset(
            dataset, vae, accelerator.device, num_workers=cfg.data.num_workers,
            show_progress=accelerator.is_main_process,
        )  # fmt: skip
    return dataset


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
    """Map-style data sets are shuffled; an iterable one (webdataset) shuffles and splits its shards itself."""
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
    """AdamW over what trains in ``dit``, with the fused kernel (one kernel for all parameters: 5x faster than the
    per-tensor loop on a CPU)."""
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


def save_resolved_config(cfg: TrainConfig, path: Path) -> None:
    """The config exactly as trained (interpolations resolved): what ``scripts/sample.py`` rebuilds from."""
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)), encoding="utf-8")


def build_trainer(cfg: TrainConfig, run_dir: str | Path) -> Trainer:
    """Every component built, prepared by accelerate and handed to a ``Trainer`` (resumed if configured)."""
    cfg = validate(cfg)
    run_dir = Path(run_dir)
    check_run_folder(run_dir, cfg.trainer.resume)
    accelerator = build_accelerator(cfg, run_dir)
    refuse_fsdp(accelerator)
    set_seed(cfg.trainer.seed)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_resolved_config(cfg, run_dir / "config.yaml")

    cache, cached_text = open_cache(cfg, accelerator.device) if cfg.data.cache_dir else (None, None)
    parts = build_components(cfg, accelerator.device, weight_dtype(accelerator.mixed_precision), cached_text)
    dit, vae, text_encoder, schedule = parts.dit, parts.vae, parts.text_encoder, parts.schedule

    optimizer = build_optimizer(cfg, dit)
    lr_scheduler = get_scheduler(
        cfg.optim.lr_schedule,
        optimizer,
        num_warmup_steps=cfg.optim.warmup_steps * accelerator.num_processes,
        num_training_steps=cfg.trainer.max_steps * accelerator.num_processes,
    )
    ema = None
    if cfg.trainer.ema_decay > 0:  # of what trains: the whole DiT, or a LoRA run's adapters
        ema = FusedEMA(trainable_parameters(dit.transformer), decay=cfg.trainer.ema_decay)
        ema.to(accelerator.device)
    dataset = build_training_data(cfg, accelerator, vae, cache)
    privacy = None
    if cfg.privacy.enabled:  # Poisson batches and the DP optimizer; the loader is Opacus' business, not accelerate's
        check_private_launch(accelerator)
        t = cfg.trainer
        privacy, optimizer, dataloader = make_private(
            cfg.privacy, dit, optimizer, dataset, t.batch_size, t.max_steps, t.seed,
            loader_options(cfg, dataset, accelerator.device), accelerator.device,
        )  # fmt: skip
    else:
        dataloader = build_dataloader(cfg, dataset, accelerator.device)
    dit, optimizer, lr_scheduler = accelerator.prepare(dit, optimizer, lr_scheduler)
    if privacy is None and not isinstance(dataset, IterableDataset):  # those are not sharded by accelerate
        # Sharded, without device placement: the step moves the tensors it uses (as for the loaders above), so
        # accelerate's per-batch walk through every caption string is not paid.
        dataloader = accelerator.prepare_data_loader(dataloader, device_placement=False)
    start_trackers(accelerator, cfg.logger, run_dir, dataclasses.asdict(cfg))

    context = MonitorContext(
        accelerator,
        TextToImage(vae, text_encoder, schedule, parts.latent_shape, accelerator.device),
        ema,
        cfg.logger,
    )
    monitors = build_monitors(cfg, context, run_dir, weight_dtype(accelerator.mixed_precision))
    trainer = Trainer(
        cfg, run_dir, accelerator, dit, vae, text_encoder, schedule, dataloader, optimizer, lr_scheduler, ema, monitors,
        privacy,
    )  # fmt: skip
    trainer.resume()
    return trainer


def run(cfg: TrainConfig, run_dir: str | Path) -> TrainResult:
    """Train as configured, writing everything into ``run_dir``."""
    return build_trainer(cfg, run_dir).fit()
