"""``validate``: the single-field checks declared in the schema, then the rules that span several fields.

Everything here runs before any model is built, so a bad value costs a second, not a model download. Each failure
is one ``ConfigError`` paragraph naming the key, the value, what is accepted and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dit_trainer.components.build import check_resolution, configured_buckets, pixel_multiple
from dit_trainer.components.class_labels import CLASS_LABELS, class_folders
from dit_trainer.components.families import FAMILIES
from dit_trainer.components.vae import known_downsample_factor
from dit_trainer.config.fields import check_fields
from dit_trainer.config.resolvers import register_resolvers
from dit_trainer.config.schema import DiffusionConfig, ModelConfig, TrainConfig
from dit_trainer.data import SOURCES
from dit_trainer.data.imagefolder import METADATA
from dit_trainer.diffusion import OBJECTIVES
from dit_trainer.diffusion.ddpm import BETA_SCHEDULES
from dit_trainer.diffusion.flow import FlowSchedule
from dit_trainer.errors import ConfigError
from dit_trainer.hub import require_offline_copy
from dit_trainer.prompts import load_prompts
from dit_trainer.rewards import check_reward_weights

FLOW_SCHEDULER = "FlowMatchEulerDiscreteScheduler"


def require(ok: bool, key: str, value: Any, accepted: str, fix: str | None = None) -> None:
    if not ok:
        raise ConfigError(key, value, accepted, fix)


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check what types cannot express; raise ``ConfigError`` naming the first bad key. Returns ``cfg``."""
    check_fields(cfg)
    _check_diffusion(cfg.diffusion)
    if cfg.model.pretrained is None:
        _check_architecture(cfg.model)
    factor = known_downsample_factor(cfg.vae)
    if factor is not None:  # else checked as soon as the VAE has loaded (build_components)
        check_resolution(cfg, factor)
    require(
        cfg.vae.kind != "autoencoder_kl" or bool(cfg.vae.pretrained),
        "vae.pretrained",
        cfg.vae.pretrained,
        "`vae.kind=autoencoder_kl` needs a hub id or a local path",
        "set `vae.pretrained=...` or use `vae=pixel`",
    )
    require(
        not cfg.lora.enabled or bool(cfg.model.pretrained),
        "model.pretrained",
        cfg.model.pretrained,
        "`lora.enabled=true` fine-tunes a pretrained DiT, and none is set (the base would stay random and frozen)",
        "set `model.pretrained=<hub id or path>` (with `model.subfolder=transformer` for a pipeline repository)",
    )
    if cfg.privacy.enabled:
        _check_privacy(cfg)
    if cfg.grpo.enabled:
        _check_grpo(cfg)
    check_reward_weights(cfg.reward.weights, required=cfg.monitor.grpo.enabled or cfg.grpo.enabled)
    if cfg.monitor.grpo.enabled:
        load_prompts(cfg.monitor.grpo.prompts, cfg.monitor.grpo.prompt_file, "monitor.grpo.")
    _check_conditioning(cfg)
    _check_offline_models(cfg)
    if not cfg.grpo.enabled:  # GRPO trains on its own samples and reads no data
        _check_data_path(cfg)
        if cfg.data.buckets != "none":
            _check_buckets(cfg)
    if cfg.validation.every_n_steps:
        _check_validation(cfg)
    if cfg.monitor.fid.enabled:
        _check_fid_monitor(cfg)
    return cfg


def _check_diffusion(d: DiffusionConfig) -> None:
    """The objective decides which sampler, weighting and scheduler fit; a mismatch would train and sample
    different processes."""
    family = OBJECTIVES[d.objective]
    flow = family is FlowSchedule
    require(
        flow or d.scheduler != FLOW_SCHEDULER,
        "diffusion.objective",
        d.objective,
        f"`{FLOW_SCHEDULER}` (configs/diffusion/flow.yaml) trains with flow matching",
        "set `diffusion.objective=flow_matching` as well (an experiment that sets its own objective keeps it when "
        "`diffusion=flow` is picked; `+experiment=shapes_flow` is shapes with flow matching)",
    )
    require(
        d.sampler in family.samplers,
        "diffusion.sampler",
        d.sampler,
        f"`diffusion.objective={d.objective}` samples with {' or '.join(f'`{name}`' for name in family.samplers)}",
        f"set `diffusion.sampler={next(iter(family.samplers))}`",
    )
    if flow:
        require(
            d.snr_gamma is None,
            "diffusion.snr_gamma",
            d.snr_gamma,
            "min-SNR weighting is for epsilon / v_prediction; flow matching weights with `diffusion.flow_weighting`",
            "set `diffusion.snr_gamma=null` and e.g. `diffusion.flow_weighting=sigma_sqrt`",
        )
        require(
            d.scheduler in (None, FLOW_SCHEDULER),
            "diffusion.scheduler",
            d.scheduler,
            f"flow matching uses `{FLOW_SCHEDULER}` (or null for the built-in Euler)",
            f"set `diffusion.scheduler={FLOW_SCHEDULER}` (configs/diffusion/flow.yaml does)",
        )
    else:
        require(
            d.flow_weighting == "none",
            "diffusion.flow_weighting",
            d.flow_weighting,
            "it applies to flow matching only; epsilon / v_prediction weight with `diffusion.snr_gamma`",
            "set `diffusion.flow_weighting=none`",
        )
    if d.scheduler is None:
        require(
            d.beta_schedule in BETA_SCHEDULES,
            "diffusion.beta_schedule",
            d.beta_schedule,
            f"the fallback schedule computes {', '.join(BETA_SCHEDULES)}",
            "set e.g. `diffusion.beta_schedule=linear`",
        )
    require(
        d.sample_steps <= d.num_train_timesteps,
        "diffusion.sample_steps",
        d.sample_steps,
        f"it must be between 1 and diffusion.num_train_timesteps ({d.num_train_timesteps})",
    )
    require(
        0 < d.beta_start < d.beta_end < 1,
        "diffusion.beta_start/beta_end",
        (d.beta_start, d.beta_end),
        "they must satisfy 0 < beta_start < beta_end < 1",
    )


def _check_architecture(m: ModelConfig) -> None:
    inner = m.num_attention_heads * m.attention_head_dim
    require(
        m.cross_attention_dim in (None, inner),
        "model.cross_attention_dim",
        m.cross_attention_dim,
        f"PixArt's caption projection maps text features to heads x head_dim = {m.num_attention_heads} x "
        f"{m.attention_head_dim} = {inner}, so cross_attention_dim must equal {inner}",
        f"set `model.cross_attention_dim={inner}` or `model.cross_attention_dim=null`",
    )


def _check_privacy(cfg: TrainConfig) -> None:
    """The combinations that would void the DP guarantee or fail inside Opacus."""
    p, t = cfg.privacy, cfg.trainer
    require(
        (p.noise_multiplier is None) != (p.target_epsilon is None),
        "privacy.noise_multiplier/target_epsilon",
        (p.noise_multiplier, p.target_epsilon),
        "exactly one of them must be set (the noise, or the budget the noise is calibrated to)",
        "set e.g. `privacy.target_epsilon=8` and `privacy.noise_multiplier=null`",
    )
    require(
        t.gradient_accumulation_steps == 1,
        "trainer.gradient_accumulation_steps",
        t.gradient_accumulation_steps,
        "under `privacy.enabled=true` each optimizer step must see one Poisson-sampled batch (accumulating "
        "several would change the sampling rate the privacy accounting assumes)",
        f"set `trainer.gradient_accumulation_steps=1` and "
        f"`trainer.batch_size={t.batch_size * t.gradient_accumulation_steps}` (the expected batch size)",
    )
    require(
        not t.gradient_checkpointing,
        "trainer.gradient_checkpointing",
        t.gradient_checkpointing,
        "Opacus computes per-sample gradients from hooks that checkpointing's recomputation would run twice",
        "set `trainer.gradient_checkpointing=false` (lower `trainer.batch_size` if memory is short)",
    )
    require(
        t.mixed_precision != "fp16",
        "trainer.mixed_precision",
        t.mixed_precision,
        "fp16's loss scaling would scale the per-sample gradients that DP clips",
        "use `trainer.mixed_precision=bf16` (or `no`)",
    )
    require(
        p.mode != "ghost" or cfg.model.family != "dit",
        "privacy.mode",
        p.mode,
        "Opacus' ghost clipping refuses DiTTransformer2DModel (it reports parameter tying)",
        "use `privacy.mode=hooks` (per-sample gradients from hooks: more memory, the same guarantee)",
    )
    require(
        not SOURCES[cfg.data.source].streamed or bool(cfg.data.cache_dir),
        "data.source",
        cfg.data.source,
        "DP needs Poisson sampling (each image drawn independently at every step), which a stream cannot do",
        "use a random-access source (`data=imagefolder` or `data=hf`) or a latent cache (`data.cache_dir`)",
    )


def _check_grpo(cfg: TrainConfig) -> None:
    """What a GRPO run needs: a trained starting point, prompts, a window of steps inside the sampler."""
    g = cfg.grpo
    require(
        bool(g.init_from) or bool(cfg.model.pretrained),
        "grpo.init_from",
        g.init_from,
        "GRPO fine-tunes a trained DiT, and neither a run to start from nor `model.pretrained` is set",
        "set `grpo.init_from=RUN_DIR` (a run train.py wrote) or `model.pretrained=<hub id or path>`",
    )
    load_prompts(g.prompts, g.prompt_file, "grpo.")
    window_end = g.sde_start + (g.sde_steps or 1)
    require(
        window_end < g.sample_steps,
        "grpo.sde_start/sde_steps",
        (g.sde_start, g.sde_steps),
        f"the trained steps must lie within the first {g.sample_steps - 1} of the `grpo.sample_steps="
        f"{g.sample_steps}` sampler steps (the last step is deterministic)",
        "lower `grpo.sde_start` or `grpo.sde_steps`, or raise `grpo.sample_steps`",
    )
    window_size = g.sde_steps or g.sample_steps - 1 - g.sde_start
    require(
        g.steps_per_trajectory is None or g.steps_per_trajectory <= window_size,
        "grpo.steps_per_trajectory",
        g.steps_per_trajectory,
        f"a trajectory has only {window_size} trained steps (the `grpo.sde_start`/`sde_steps` window) to draw from",
        f"set `grpo.steps_per_trajectory={window_size}` or lower, or null for all of them",
    )
    require(
        g.prompts_per_epoch * g.group_size >= g.minibatches,
        "grpo.minibatches",
        g.minibatches,
        f"an epoch's {g.prompts_per_epoch} x {g.group_size} trajectories per process cannot fill that many updates",
        f"set `grpo.minibatches={g.prompts_per_epoch * g.group_size}` or lower",
    )
    require(
        not cfg.privacy.enabled,
        "privacy.enabled",
        True,
        "GRPO trains on generated images, not on the data set, so DP-SGD's per-example guarantee has nothing to "
        "protect there",
        "set `privacy.enabled=false`",
    )
    require(
        cfg.trainer.gradient_accumulation_steps == 1,
        "trainer.gradient_accumulation_steps",
        cfg.trainer.gradient_accumulation_steps,
        "a GRPO update takes one minibatch of trajectories (all its trained steps in one backward)",
        "set `trainer.gradient_accumulation_steps=1`; for less memory per update raise `grpo.minibatches`",
    )


def _check_conditioning(cfg: TrainConfig) -> None:
    """A class-conditional family needs class labels and a text-conditioned one a text encoder; class labels need
    their names, and the prompts a run samples must be among them."""
    family, text = FAMILIES[cfg.model.family], cfg.text_encoder
    classes = text.kind == CLASS_LABELS
    require(
        classes == (family.condition == "class"),
        "text_encoder.kind",
        text.kind,
        f"`model.family={cfg.model.family}` is conditioned on "
        + ("class labels" if family.condition == "class" else "text"),
        "set `text_encoder.kind=class_labels` (with `model.family=dit`)"
        if family.condition == "class"
        else "use a text encoder (`text_encoder=minilm` or `t5`), or `model.family=dit` for class labels",
    )
    if not classes:
        return
    require(
        bool(text.classes),
        "text_encoder.classes",
        text.classes,
        "class labels need the class names, and `data.path` is not a folder of class sub-folders to read them from",
        "list them (`text_encoder.classes=[cat,dog]`, ids in that order) or train on class sub-folders",
    )
    require(
        not cfg.data.cache_dir,
        "data.cache_dir",
        cfg.data.cache_dir,
        "a disk cache of class-conditional data is not supported yet",
        "cache in memory instead (`data.cache_latents=true`)",
    )
    grpo = cfg.monitor.grpo
    monitored = load_prompts(grpo.prompts, grpo.prompt_file, "monitor.grpo.") if grpo.enabled else []
    ids = {str(index) for index in range(len(text.classes))}
    unknown = [p for p in [*cfg.trainer.sample_prompts, *monitored] if p not in text.classes and p not in ids]
    require(
        not unknown,
        "trainer.sample_prompts",
        unknown[:3],
        f"a class-conditional run samples class names or ids, and these are neither (classes: "
        f"{', '.join(text.classes[:10])}{', ...' if len(text.classes) > 10 else ''})",
        "sample class names or ids, e.g. `trainer.sample_prompts=[0,1,2]`",
    )


def _check_offline_models(cfg: TrainConfig) -> None:
    """Under HF_HUB_OFFLINE=1, every model named by hub id must already be on this machine."""
    models = {
        "vae.pretrained": cfg.vae.pretrained if cfg.vae.kind == "autoencoder_kl" else None,
        "text_encoder.pretrained": cfg.text_encoder.pretrained if cfg.text_encoder.kind != CLASS_LABELS else None,
        "model.pretrained": cfg.model.pretrained,
        "diffusion.scheduler_pretrained": cfg.diffusion.scheduler_pretrained,
        "reward.clip_model": cfg.reward.clip_model
        if (cfg.monitor.grpo.enabled or cfg.grpo.enabled) and "clip_score" in cfg.reward.weights
        else None,
    }
    for key, name_or_path in models.items():
        if name_or_path:
            require_offline_copy(str(name_or_path), key)


def _check_data_path(cfg: TrainConfig) -> None:
    if cfg.data.mixture:
        _check_mixture(cfg)
        return
    _check_source_path(cfg.data.source, cfg.data.path, "data.path")


def _check_source_path(name: str, path: str | None, key: str) -> None:
    source = SOURCES[name]
    if source.path_meaning is None:
        return
    require(
        bool(path),
        key,
        path,
        f"`data={name}` needs {source.path_meaning}",
        f"add `{key}={source.path_example}` to the command line",
    )
    if source.check_path is not None:
        source.check_path(path, key)


def _check_mixture(cfg: TrainConfig) -> None:
    """A mixture's entries name random-access sources with their paths; the settings that need one source (or a
    stream-free sampler) are refused with it."""
    data, key = cfg.data, "data.mixture"
    for position, entry in enumerate(data.mixture):
        require(
            not SOURCES[entry.source].streamed,
            f"{key}[{position}].source",
            entry.source,
            "a mixture draws each epoch's items by weight from random-access data sets, and a stream has no "
            "items to draw",
            "mix imagefolder, hf or shapes data sets (write the shards' images to a folder, or train on the "
            "stream alone)",
        )
        _check_source_path(entry.source, entry.path, f"{key}[{position}].path")
    for name, value, reason, fix in (
        ("data.path", data.path, "the entries name their own paths", "remove `data.path`"),
        (
            "data.cache_dir",
            data.cache_dir,
            "a disk cache is not supported yet",
            "cache in memory instead (`data.cache_latents=true`), or precompute and train on one data set",
        ),
        (
            "privacy.enabled",
            cfg.privacy.enabled,
            "DP's Poisson sampling draws every image with the same probability, so it cannot weight sources",
            "train one data set under DP",
        ),
        (
            "validation.path",
            cfg.validation.path,
            "validation images are held out of the mixture's own data sets",
            "set `validation.split=0.01` and `validation.path=null`",
        ),
    ):
        require(not value, name, value, f"with `data.mixture`, {reason}", fix)


def _check_buckets(cfg: TrainConfig) -> None:
    """Buckets need a source that reads image sizes, batches that can be made one bucket at a time, and sizes the
    latents cut into whole patches."""
    sources = [entry.source for entry in cfg.data.mixture] or [cfg.data.source]
    square = next((name for name in sources if not SOURCES[name].bucketed), None)
    require(
        square is None,
        "data.buckets",
        cfg.data.buckets,
        f"`{square}` gives square images of one size, so every image would land in one bucket",
        "use buckets with a folder or data set of real images (`data=imagefolder`, `data=hf`), or set "
        "`data.buckets=none`",
    )
    require(
        not cfg.privacy.enabled,
        "data.buckets",
        cfg.data.buckets,
        "DP's Poisson sampling draws every image independently at every step, so a batch cannot be kept to one bucket",
        "set `data.buckets=none` under `privacy.enabled=true`",
    )
    if pixel_multiple(cfg) is not None:  # else the models' config files are downloaded when the data is read
        configured_buckets(cfg)


def _check_validation(cfg: TrainConfig) -> None:
    """Validation needs held-out data: a fraction of a random-access data set, or a folder of its own."""
    v, source = cfg.validation, SOURCES[cfg.data.source]
    require(
        not cfg.grpo.enabled,
        "validation.every_n_steps",
        v.every_n_steps,
        "a GRPO run trains on its own samples and reads no data set to hold images out of",
        "set `validation.every_n_steps=0`",
    )
    require(
        (v.split > 0) != bool(v.path),
        "validation.split",
        v.split,
        f"validation needs held-out images from exactly one place (`validation.path` is {v.path!r})",
        "hold out a fraction of the data (`validation.split=0.01`) or name a folder (`validation.path=...` with "
        "`validation.split=0`)",
    )
    require(
        v.split == 0 or not source.streamed,
        "validation.split",
        v.split,
        f"`data={cfg.data.source}` is streamed, and a stream has no items to hold out by index",
        "write held-out shards and set `validation.path=<their brace pattern>` with `validation.split=0`",
    )
    require(
        not (v.path and cfg.data.cache_dir),
        "validation.path",
        v.path,
        "training from a latent cache (`data.cache_dir`) loads neither the VAE encoder nor the text encoder, so "
        "images outside the cache cannot be validated",
        "hold out part of the cached data instead (`validation.split=0.01`, `validation.path=null`)",
    )
    require(
        v.timesteps <= cfg.diffusion.num_train_timesteps,
        "validation.timesteps",
        v.timesteps,
        f"there are only {cfg.diffusion.num_train_timesteps} training timesteps to stratify",
        f"set `validation.timesteps={min(8, cfg.diffusion.num_train_timesteps)}`",
    )
    if v.path and source.check_path is not None:
        source.check_path(v.path, "validation.path")


def _check_fid_monitor(cfg: TrainConfig) -> None:
    """The FID monitor compares samples with the validation images, read as images."""
    require(
        bool(cfg.validation.every_n_steps),
        "monitor.fid.enabled",
        True,
        "the FID monitor compares samples with the validation images, and validation is off",
        "turn validation on (`validation.every_n_steps=5000 validation.split=0.01`, or `validation.path=...`)",
    )
    require(
        not (cfg.monitor.fid.features == "vae" and cfg.data.cache_dir),
        "monitor.fid.features",
        "vae",
        "training from a latent cache (`data.cache_dir`) does not load the VAE encoder these features come from",
        "use `monitor.fid.features=inception`, or compute FID after training with `scripts/evaluate.py RUN "
        "metrics=[fid] fid_features=vae`",
    )


def to_train_config(cfg: DictConfig | TrainConfig, overrides: Sequence[str] | None = None) -> TrainConfig:
    """A composed Hydra config (or a ``TrainConfig`` built in Python) as validated dataclasses, interpolations
    such as ``${asset:shapes_vae}`` resolved. A GRPO run's ``grpo.init_from`` is applied here, once (a run's saved
    config records it in ``grpo.init_weights``); ``overrides`` are the command line's, to tell which values were
    set by hand."""
    register_resolvers()
    structured = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg))
    if structured.grpo.init_from and structured.grpo.init_weights is None:
        from dit_trainer.grpo.init import start_from_run  # it reads run folders, whose module imports this one

        structured = start_from_run(structured, overrides)
    return validate(with_class_folders(structured))


def with_class_folders(cfg: TrainConfig) -> TrainConfig:
    """A class-conditional run on an image folder of class sub-folders, with ``text_encoder.classes`` unset, gets
    the sub-folder names (sorted, as torchvision numbers them), recorded in its saved config: sampling and export
    later read the classes there, with no data at hand."""
    text, data = cfg.text_encoder, cfg.data
    if text.kind != CLASS_LABELS or text.classes or data.source != "imagefolder" or not data.path:
        return cfg
    folder = Path(data.path).expanduser()
    if not folder.is_dir() or (folder / METADATA).is_file():
        return cfg
    return dataclasses.replace(cfg, text_encoder=dataclasses.replace(text, classes=class_folders(folder)))
