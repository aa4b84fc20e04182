"""The training configuration: one dataclass per concern, the single source of every default and field's meaning.

``python train.py`` with no overrides runs exactly ``TrainConfig()``: a 1.3 M-parameter PixArt DiT on the embedded
shapes data, its tiny VAE and the MiniLM text encoder, sized for a CPU. YAML files in ``configs/`` hold only
alternatives (``model=pixart_xl_2``) and what an experiment changes. Each field's single-value check sits beside it
(``fields``). A choice that names an implementation (a family, a data source, a VAE or conditioner kind, an
objective, a sampler, a reward) is a plain name here, checked by the package that owns its registry; closed
vocabularies come from ``choices``. This package imports nothing of dit-trainer but ``errors``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from dit_trainer.config.choices import (
    CACHE_DTYPES,
    CROPS,
    FLOW_WEIGHTINGS,
    TIMESTEP_DENSITIES,
    is_bucket_spec,
)
from dit_trainer.config.conditioner import ConditionerConfig, RenamedTextEncoder
from dit_trainer.config.fields import at_least, checked, fraction, non_empty, one_of, open_unit, positive
from dit_trainer.config.grpo import GRPOConfig, RewardConfig
from dit_trainer.config.monitors import MonitorConfig, ValidationConfig
from dit_trainer.config.nft import NFTConfig
from dit_trainer.config.optim import OptimConfig
from dit_trainer.config.precision import PrecisionConfig


@dataclass
class ModelConfig:
    """The trainable DiT: a transformer of ``family`` built from these fields or loaded pretrained.

    The defaults are a 1.3 M-parameter PixArt DiT for CPU runs; ``model=pixart_xl_2`` is DiT-XL/2.
    """

    DEFINES_TRAINING: ClassVar[bool] = True  # changed at a resume, another thing is trained (refused unless allowed)

    # pixart_alpha | pixart_sigma (diffusers' PixArtTransformer2DModel, text-conditioned; they differ in the pipeline
    # an export writes) | dit (DiTTransformer2DModel, class-conditional: with `conditioner.kind=class_labels`) |
    # sd3 (SD3Transformer2DModel: SD3, SD3.5) | flux (FluxTransformer2DModel) | sana (SanaTransformer2DModel) |
    # z_image (ZImageTransformer2DModel) | qwen_image (QwenImageTransformer2DModel) | flux2 (Flux2Transformer2DModel) |
    # wan (WanTransformer3DModel: Wan 2.1/2.2 text-to-video; with `data.frames` > 1 it trains on clips) |
    # package.module:FAMILY, a family of your own (dit_trainer.components.families)
    family: str = "pixart_alpha"
    pretrained: str | None = None  # hub id or local path; when set, the architecture fields below are ignored
    subfolder: str | None = None
    revision: str | None = None
    num_layers: int = at_least(1, 4)
    num_attention_heads: int = at_least(1, 4)
    attention_head_dim: int = at_least(1, 32)
    cross_attention_dim: int | None = None  # defaults to heads x head_dim, the only value PixArt accepts
    patch_size: int = at_least(1, 4)
    learned_sigma: bool = False  # out_channels = 2 x latent channels; the variance half is ignored by the loss
    dropout: float = fraction(0.0)
    # Further constructor arguments of the family's diffusers transformer (keys of its config.json) for a new model,
    # e.g. {qk_norm: rms_norm, dual_attention_layers: [0, 1]} for SD3.5-Medium's MMDiT-X, {num_single_layers: 2}
    # for Flux. Each value is checked against the class's constructor (type; the ranges the family knows) before
    # any model loads.
    extra_config: dict[str, Any] = field(default_factory=dict)
    # A guidance-distilled model's guidance strength, fed to its guidance embedding in training and sampling (Flux
    # with guidance_embeds, e.g. FLUX.1-dev: FluxPipeline's `guidance_scale`; 3.5 is diffusers' Flux LoRA default).
    # Models without a guidance embedding ignore it; true CFG is `diffusion.guidance_scale` (1: off).
    embedded_guidance: float = positive(3.5)


@dataclass
class LoRAConfig:
    """LoRA fine-tuning (peft) of a pretrained DiT: the base is frozen, only adapters (and ``train_modules``) train.
    Checkpoints hold only what trains, in peft's format."""

    DEFINES_TRAINING: ClassVar[bool] = True  # changed at a resume, another thing is trained (refused unless allowed)

    enabled: bool = False
    rank: int = at_least(1, 16, "set e.g. `lora.rank=16`")
    alpha: float = positive(16.0, "set e.g. `lora.alpha=16` (the usual: = rank)")
    dropout: float = fraction(0.0)
    # Module name suffixes to adapt. Empty: the family's own (PixArt's and DiT's: the attention projections and
    # feed-forward layers).
    target_modules: list[str] = field(default_factory=list)
    train_modules: list[str] = field(default_factory=list)  # also trained in full, e.g. [caption_projection]


@dataclass
class PrivacyConfig:
    """Differentially private training (DP-SGD with Opacus): each sample's gradient is clipped to
    ``max_grad_norm``, Gaussian noise of std ``noise_multiplier x max_grad_norm`` is added to their sum, and each
    step's batch is Poisson-sampled (every image drawn independently with probability batch_size / N)."""

    DEFINES_TRAINING: ClassVar[bool] = True  # changed at a resume, another thing is trained (refused unless allowed)

    enabled: bool = False
    # C: the per-sample clipping norm (optim.max_grad_norm is not used under DP)
    max_grad_norm: float = positive(1.0, note="the clipping norm")
    # Either the noise multiplier sigma (noise std = sigma x C), or a target epsilon that sigma is calibrated to.
    noise_multiplier: float | None = positive(None, note="or null")
    target_epsilon: float | None = positive(None, note="or null")
    epochs: float | None = positive(None, note="or null")  # with target_epsilon: the epochs the budget covers
    delta: float | None = open_unit(None, note="null: 1 / the number of training images")
    # ghost: Opacus' ghost clipping (no per-sample gradients stored) | hooks: per-sample gradients (more memory)
    mode: str = one_of(("ghost", "hooks"), "ghost")
    accountant: str = one_of(("prv", "rdp", "gdp"), "prv")  # Opacus accountants
    # Also send W&B the metrics computed on the private batches (the loss, its per-timestep buckets, skipped steps,
    # unreadable files), which the DP guarantee does not cover. Off: W&B gets only the learning rate, the noised
    # gradient's norm, throughput, epsilon and the monitors; metrics.jsonl and TensorBoard (files in the run
    # folder) always get everything.
    log_losses_to_trackers: bool = False


@dataclass
class VAEConfig:
    """The frozen autoencoder that maps images to the latents the DiT learns on. The default is the tiny
    ``AutoencoderKL`` shipped with the package (trained on the shapes data: 32 px -> 4 x 16 x 16)."""

    DEFINES_TRAINING: ClassVar[bool] = True  # changed at a resume, another thing is trained (refused unless allowed)

    # autoencoder_kl (SD, SDXL, SD3, Flux) | autoencoder_dc (Sana's deterministic 32x one) | qwen_image (Qwen-Image's
    # video autoencoder, on one-frame videos) | flux2 (FLUX.2's, its latents in 2 x 2 patches) | pixel: identity
    kind: str = "autoencoder_kl"
    pretrained: str | None = "${asset:shapes_vae}"  # hub id or local path of a diffusers autoencoder of that kind
    subfolder: str | None = None
    revision: str | None = None


@dataclass
class MixtureSource:
    """One data set of a mixture (an entry of ``data.mixture``): what ``data.*`` says for a single source."""

    source: str = "imagefolder"
    path: str | None = None
    weight: float = checked(  # infinity would make every share NaN
        lambda value: 0 < value < math.inf,
        "it must be a finite number > 0 (its share of each epoch is weight / the sum of the weights)",
        "give each entry of `data.mixture` a finite weight > 0, e.g. `weight: 3` and `weight: 1` for a 75 % / 25 % mix",
        1.0,
    )
    name: str | None = None  # in logs and the `data/skipped/<name>` metric; default: the source and its position
    split: str = "train"  # hf
    image_column: str = "image"  # hf
    caption_column: str = "text"


@dataclass
class DataConfig:
    """Where images and captions come from, how they are prepared, and how they are fed (see configs/data/)."""

    DEFINES_TRAINING: ClassVar[bool] = True  # changed at a resume, another thing is trained (refused unless allowed)
    # ... except how fast it is read and where its encodings are kept:
    MAY_CHANGE_ON_RESUME: ClassVar[frozenset[str]] = frozenset(
        {"num_workers", "prefetch_factor", "max_bad_fraction", "cache_dir", "cache_dtype", "cache_shard_size"}
    )

    source: str = "shapes"  # shapes | imagefolder | hf | webdataset | package.module:SOURCE (dit_trainer.data)
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
    resolution: int = at_least(8, 32)
    # Frames per training clip: 1 trains on images (an image is a one-frame clip to a video family); more needs a
    # source of clips (videofolder, moving_shapes) and a video family (wan). A temporal VAE (Wan's: the first frame,
    # then groups of 4) needs 4k + 1 frames.
    frames: int = at_least(1, 1)
    # Clips are resampled to this rate before `frames` consecutive frames are taken (the start drawn from the run's
    # generator); null: every frame at the file's own rate
    fps: float | None = positive(None, note="or null")
    crop: str = one_of(CROPS, "center")  # center | random | none (squash the whole image to the target size)
    # Aspect-ratio buckets: none (every image cut to a `resolution` square) | pixart (PixArt's bin table, scaled to
    # `resolution`) | a list of [height, width] sizes in pixels. Each image is trained at the bucket nearest its
    # aspect ratio (resized to cover it, then cropped), and every batch holds one bucket.
    buckets: Any = checked(
        is_bucket_spec,
        "it must be none, pixart, or a list of [height, width] pairs of pixel sizes (none as a word: null is no "
        "setting here)",
        "set e.g. `data.buckets=pixart` or `data.buckets=[[32,32],[24,40],[40,24]]`",
        "none",
    )
    shuffle_buffer: int = at_least(0, 1000, note="0: tar order")  # webdataset: samples shuffled within this window
    horizontal_flip: bool = False
    caption_dropout: float = fraction(0.1)  # probability of training on the empty prompt, for CFG
    # Caption tools for tag captions ("tag, tag, ..."; a caption without commas is one tag). A trigger word or
    # phrase put before every caption of a file source as its first tag (`PREFIX, caption`): never shuffled or
    # dropped, and in the caches and validation too. The sample prompts are used as written: put it in them yourself.
    caption_prefix: str = ""
    # Each step, shuffle every caption's tags, the first `keep_tags` staying in place. Not with `data.cache_dir`.
    shuffle_tags: bool = False
    keep_tags: int = at_least(0, 0)  # tags kept first and never dropped, after the prefix (kohya's keep_tokens)
    # Each step, drop every tag after the first `keep_tags` with this probability. Not with `data.cache_dir`.
    tag_dropout: float = fraction(0.0)
    # Unreadable images are skipped and counted (`data/skipped`); above this fraction of all files read, the run
    # stops and names the first bad files.
    max_bad_fraction: float = fraction(0.01)
    # Data-loader worker processes per training process. 0 here: shapes and the caches decode nothing; the file
    # sources' groups (configs/data/) set 4. Measured (`scripts/benchmark.py --loader`, 2-core CPU under load, 512x384
    # JPEGs, batch 32): one process decodes ~130 img/s at 256 px (~210 at 64 px) while the CPU trainer step, encoding
    # every batch, consumes 0.3 img/s at 256 px (10.7 at 64 px). A GPU step consuming N img/s needs ~N/130 workers:
    # 4 covers ~500 img/s (about an uncached DiT-XL/2 at 256 px on an H100 at 40 % MFU, by FLOPs). More than this
    # process's share of the CPUs it may use (its affinity / the training processes of the machine) is lowered to
    # that share with a warning; a stream (webdataset) keeps its count, warned: its saved position is per worker.
    num_workers: int = at_least(0, 0)
    # Batches each worker prepares ahead (only with num_workers > 0): 2 x 4 workers hold 8 batches, several steps of
    # decoding jitter; as uint8 a 256-px batch of 32 is 6 MB.
    prefetch_factor: int = at_least(1, 2)
    # Encode every image once with the frozen VAE before training and keep the posteriors in memory (for data
    # sets that fit in RAM; fresh latents are still drawn every epoch).
    cache_latents: bool = False
    # A cache written by `scripts/precompute.py`: VAE posteriors and text embeddings, read instead of encoding;
    # the VAE encoder and the text encoder are then never loaded. Refused when it was made with other settings.
    cache_dir: str | None = None
    cache_dtype: str = one_of(CACHE_DTYPES, "float16")  # how precompute stores the tensors
    cache_shard_size: int = at_least(1, 1024)  # items per cache shard file (T5-XXL embeddings: ~1 MB per item)
    # Several data sets, each batch's items drawn by weight, e.g.
    # [{source: imagefolder, path: /data/photos, weight: 3}, {source: hf, path: /data/art, name: art}]. Each entry
    # names its source, path and columns; the rest of data.* (resolution, buckets, crop, ...) applies to all.
    # With a webdataset entry, one endless stream whose items' sources are drawn by weight.
    # Empty: the single source data.source / data.path.
    mixture: list[MixtureSource] = field(default_factory=list)
    length: int = at_least(1, 20_000)  # shapes: number of distinct images
    # shapes: which images; webdataset: the shard shuffle (seed + epoch); a streamed mixture's draws
    seed: int = at_least(0, 0)


@dataclass
class DiffusionConfig:
    """The noise schedule, the objective and how to sample (the same schedule object does all three)."""

    DEFINES_TRAINING: ClassVar[bool] = True  # changed at a resume, another thing is trained (refused unless allowed)
    MAY_CHANGE_ON_RESUME: ClassVar[frozenset[str]] = frozenset({"sampler", "sample_steps", "guidance_scale"})

    # A diffusers scheduler class name (DDPMScheduler, DDIMScheduler, ...); null uses the built-in fallback.
    scheduler: str | None = "DDPMScheduler"
    scheduler_pretrained: str | None = None  # load the scheduler config from a hub id or path (subfolder scheduler)
    # epsilon | v_prediction (DDPM noise, x_t = sqrt(a) x0 + sqrt(1-a) eps) | flow_matching (rectified flow,
    # x_t = (1 - sigma) x0 + sigma eps, target eps - x0, with scheduler FlowMatchEulerDiscreteScheduler or null)
    objective: str = "epsilon"
    num_train_timesteps: int = at_least(2, 1000)
    beta_schedule: str = "linear"  # the fallback computes linear | scaled_linear | squaredcos_cap_v2
    beta_start: float = 0.0001
    beta_end: float = 0.02
    # flow_matching: sigma -> shift sigma / (1 + (shift - 1) sigma); > 1 for higher resolutions
    shift: float = positive(1.0, note="1 means no shift")
    # flow_matching: Flux's resolution-dependent shift instead of `shift`, in training and sampling: sigma is shifted
    # by e^mu, mu linear in the image's tokens (latent H/2 x W/2) from base_shift at base_image_seq_len tokens to
    # max_shift at max_image_seq_len (FluxPipeline's calculate_shift; an export ships the scheduler that does it)
    resolution_shift: bool = False
    base_shift: float = 0.5  # resolution_shift: mu at base_image_seq_len tokens
    max_shift: float = 1.15  # resolution_shift: mu at max_image_seq_len tokens
    base_image_seq_len: int = at_least(1, 256)
    max_image_seq_len: int = at_least(1, 4096)
    # resolution_shift: how mu follows the image: linear (Flux's, Qwen-Image's: in the tokens of 2 x 2 latents, from
    # base_shift to max_shift) | flux2 (FLUX.2's empirical mu of the latent positions and the sampler's step count;
    # training's at 50 steps, its pipeline's default)
    resolution_shift_rule: str = one_of(("linear", "flux2"), "linear")
    # resolution_shift: sampling's noise levels stretched to end at this one instead of 1/N's (Qwen-Image's
    # shift_terminal, 0.02); training's timesteps are not stretched. null: no stretch
    shift_terminal: float | None = fraction(None, note="or null")
    # Where training timesteps fall: uniform | logit_normal | mode | cosmap (SD3's densities)
    timestep_sampling: str = one_of(TIMESTEP_DENSITIES, "uniform")
    logit_mean: float = 0.0  # logit_normal
    logit_std: float = positive(1.0)  # logit_normal
    mode_scale: float = 1.29  # mode
    snr_gamma: float | None = positive(None, note="or null")  # epsilon / v_prediction: min-SNR-gamma (5.0 is usual)
    flow_weighting: str = one_of(FLOW_WEIGHTINGS, "none")  # flow_matching: none | sigma_sqrt | cosmap
    # epsilon / v_prediction: offset noise (Guttenberg 2023, diffusers' --noise_offset): each image's noise gets this
    # times one normal draw per channel, constant over the image, so the model learns to change an image's overall
    # brightness (very dark or light images). 0.05-0.1 is usual; 0 is off. Refused for flow matching.
    noise_offset: float = at_least(0, 0.0, note="0 is off")
    # ddim | dpmsolver++ for epsilon / v_prediction (the fallback schedule has its own DDIM); euler for flow_matching
    sampler: str = "ddim"
    sample_steps: int = at_least(1, 25)
    guidance_scale: float = at_least(0, 3.0, "set e.g. `{key}=3.0`", note="1 disables CFG")


@dataclass
class TrainerConfig:
    """The loop: how long, how big, in what precision, and when to log, checkpoint and sample."""

    # What a resume itself changes, and what defines the trained thing: the method, the run it started from and the
    # seed (the data order: another one in mid-epoch would read some images twice and miss others).
    RESUMING: ClassVar[frozenset[str]] = frozenset({"resume", "max_steps", "allow_config_change"})
    DEFINING: ClassVar[frozenset[str]] = frozenset({"method", "init_from", "init_ema", "init_weights", "seed"})

    # How the DiT is trained: sft (noise / velocity prediction on the data, the default) | grpo (reward
    # fine-tuning on its own samples, section `grpo`) | nft (DiffusionNFT, section `nft`) |
    # `package.module:ATTRIBUTE` (a method of your own).
    method: str = "sft"
    # A run folder (its newest checkpoint) or one of its checkpoint folders to start from: the model, VAE, text
    # encoder, data and diffusion settings come from that run, the weights from that checkpoint. Null: start from
    # `model.pretrained` (or from scratch).
    init_from: str | None = None
    init_ema: bool = True  # start from the checkpoint's EMA weights (when it has them)
    # Written by train.py when it applies `init_from`: the weights folder the run started from. Not set by hand.
    init_weights: str | None = None
    max_steps: int = at_least(1, 1000)
    batch_size: int = at_least(1, 32)  # per process
    gradient_accumulation_steps: int = at_least(1, 1)
    gradient_checkpointing: bool = False  # recompute each DiT block's activations in backward: less memory
    # Selective checkpointing: with gradient_checkpointing, only every k-th block is recomputed (2: half of them), the
    # others keep their activations; the memory estimate says what each k needs
    gradient_checkpointing_every: int = at_least(1, 1)
    # torch's re-entrant variant (use_reentrant=True): it gives no gradient to a block whose inputs do not require
    # grad, e.g. LoRA on a frozen patch embedding; the step-0 preflight says so. Off: the non-re-entrant variant.
    reentrant_checkpointing: bool = False
    # Regional torch.compile: each DiT block compiled in place (one graph that every block reuses); the first step
    # waits for the compile. Several latent shapes (`data.buckets`) are compiled for dynamic shapes from the start.
    compile: bool = False
    # Each attention's q, k and v projections as one matmul (the blocks of PixArt and DiT, whose attention diffusers'
    # fused processor takes); the weights, their names and every checkpoint stay the unfused model's
    fused_qkv: bool = False
    seed: int = checked(lambda value: 0 <= value < 2**32, "it must be in [0, 2**32)", "set e.g. `{key}=0`", 0)
    # auto: bf16 on recent GPUs, fp16 + grad scaler on older ones, fp32 on CPU/MPS
    mixed_precision: str = one_of(("auto", "no", "fp16", "bf16"), "auto")
    ema_decay: float = fraction(0.9999, note="0 disables EMA")
    log_every: int = at_least(1, 10)
    checkpoint_every: int = at_least(0, 500, note="0 means only at the end of training")
    checkpoints_total_limit: int | None = at_least(1, None, note="null keeps them all")  # the newest N are kept
    sample_every: int = at_least(0, 500, note="0 means only at the end of training")
    sample_prompts: list[str] = non_empty(
        lambda: ["a red circle", "a blue square", "a yellow triangle", "a white circle"]
    )
    sample_seed: int = 0
    # A run folder (or a checkpoint folder in one): continue that run there, with the config it recorded plus this
    # command line's overrides | latest: the newest checkpoint in hydra.run.dir | the path of a checkpoint folder
    resume: str | None = None
    # Resuming with another model, data or objective than the checkpoint's is refused unless this is true.
    allow_config_change: bool = False
    # Steps with NaN/inf loss or gradients are skipped; this many in a row stop the run with a report.
    max_consecutive_nonfinite: int = at_least(1, 10)
    # How long a process waits in a collective before the run fails: long enough for the monitors the main process
    # runs while the others wait (FID over thousands of samples); NCCL's own default is 10 minutes.
    collective_timeout_minutes: int = at_least(1, 120)


@dataclass
class LoggerConfig:
    """Trackers on top of metrics.jsonl (always written). The W&B fields apply to `logger=wandb` only."""

    name: str = one_of(("none", "wandb", "tensorboard"), "none")
    # null: W&B decides (WANDB_MODE, `wandb offline`; online by default) | online | offline (sync later with
    # `wandb sync RUN/wandb/offline-run-*`) | disabled. A value set here overrides WANDB_MODE.
    mode: str | None = one_of(("online", "offline", "disabled"), None)
    project: str = "dit-trainer"
    entity: str | None = None
    run_name: str | None = None  # null: the run folder's name
    group: str | None = None  # null: the experiment's name (`+experiment=NAME`)
    tags: list[str] = field(default_factory=list)  # empty: the experiment's name
    notes: str | None = None
    log_model: bool = True  # the final weights (EMA when kept) as the W&B model artifact `model-<run id>`
    log_checkpoints: bool = False  # every checkpoint's weights as a version of that artifact too


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    conditioner: ConditionerConfig = field(default_factory=ConditionerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    nft: NFTConfig = field(default_factory=NFTConfig)
    text_encoder: RenamedTextEncoder = field(default_factory=RenamedTextEncoder)  # now `conditioner`


def section_types() -> dict[str, type]:
    """Each section of the run config by its key: what its class declares about it (``DEFINES_TRAINING``, ...)."""
    return {section.name: section.default_factory for section in fields(TrainConfig)}
