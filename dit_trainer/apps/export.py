"""Export one checkpoint of a run for the diffusers ecosystem (``scripts/export.py``).

The layout is the model family's (``Family.export``):

- **PixArt runs** become a complete folder of the family's pipeline (``PixArtAlphaPipeline``, ``PixArtSigmaPipeline``:
  ``transformer/``, ``vae/``, ``text_encoder/``, ``tokenizer/``, ``scheduler/``, ``model_index.json``) with the run's
  own text encoder (T5, the shapes default's MiniLM, CLIP), so ``DiffusionPipeline.from_pretrained(folder)`` generates
  images with no dit-trainer installed. SD3, Flux and Sana runs on their own encoders are whole pipeline folders too
  (their other layouts: ``families/mmdit_export.py``, ``families/sana.py``).
- **Class-conditional runs** (``model.family=dit``) become a ``DiTPipeline`` folder (``transformer/``, ``vae/``,
  ``scheduler/``) whose ``get_label_ids`` knows the class names.

Every export writes ``dit_trainer_export.json``: which checkpoint and weights (EMA or raw), the dtype, the
generation settings that reproduce the run's sampler (``generation``), what ``pipe(prompt)`` needs beyond its
defaults to generate at the trained size where the pipeline hard-codes something a folder cannot set (``required``:
PixArt's resolution binning off at sizes other than its own), and a ``usage`` snippet. Nothing in the folder is an
absolute path: the manifest's paths are relative to it (``run_dir``, the ``usage`` snippet's ``folder``), and the
models' configs drop the ``_name_or_path`` they were loaded from, so an export moved with or without its run stays
self-describing. A LoRA run's export also holds the adapter alone where the family's pipeline loads it with
``load_lora_weights`` (``export_lora``).
The folder is written under a staging name beside ``out_dir`` (``.NAME.partial-HOST-PID-START-XXXX``), flushed, given
the modes the user's umask gives new files (``durable.publish``: the writers make 0600 files and a 0700 folder) and
renamed in one step when complete. A killed export leaves its staging folder behind; the next export to the same
``out_dir`` removes those whose process is gone, and nothing else.

Latent normalisation is folded into the exported VAE. ``FrozenVAE`` normalises latents per channel,
``(z - mean) * scaling_factor / std``, but ``PixArtAlphaPipeline`` decodes ``latents / vae.config.scaling_factor``
with no per-channel statistics and no shift. Both are affine maps per channel, and the autoencoder's 1x1
``post_quant_conv`` (decode side) and ``quant_conv`` (encode side) are affine too, so the statistics are folded
into those convolutions exactly and dropped from the exported config. The exported VAE then speaks the
normalised latent space divided by ``scaling_factor``: ``decode(z / scaling_factor)`` is ``FrozenVAE.decode(z)``
and ``encode(x).latent_dist.mean * scaling_factor`` is ``FrozenVAE.encode(x)``. (QwenImagePipeline and
Flux2KleinPipeline apply the VAE's own statistics themselves: their VAEs are exported as they are.)
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from diffusers import AutoencoderDC, AutoencoderKL, ModelMixin

from dit_trainer.apps.export_lora import export_adapter
from dit_trainer.apps.inference import check_sampling_args, load_run
from dit_trainer.apps.model_card import write_model_card
from dit_trainer.components.build import trained_start
from dit_trainer.components.dit import load_trained_transformer, load_transformer
from dit_trainer.components.families import FAMILIES
from dit_trainer.components.families.base import ExportParts, Family
from dit_trainer.components.lora import merge_adapter
from dit_trainer.components.vae import FrozenVAE
from dit_trainer.config import ExportConfig
from dit_trainer.diffusion.checks import check_sampler
from dit_trainer.durable import fsync_tree, publish
from dit_trainer.errors import ConfigError
from dit_trainer.run_config import read_run_config
from dit_trainer.runs.run_folder import CHECKPOINTS, find_checkpoint, weights_layout
from dit_trainer.runs.run_summary import record_export

MANIFEST = "dit_trainer_export.json"


@dataclass
class ExportResult:
    out_dir: Path
    pipeline: bool  # True: the pipeline takes prompts as text; False: it takes the run's encoder's embeddings
    manifest: dict
    usage: str  # the manifest's usage with ``folder`` set to ``out_dir`` as given: what to paste now

    @property
    def message(self) -> str:
        kind = f"a {self.manifest['pipeline_class']} folder" + (
            "" if self.pipeline else " without its text encoders (it takes the embeddings of the run's: conditioner/)"
        )
        lora = (self.manifest.get("lora") or {}).get("file")
        adapter = f" The LoRA adapter alone, for the base model's load_lora_weights: {lora}." if lora else ""
        return f"Exported {self.manifest['checkpoint']} ({self.manifest['weights']} weights) as {kind} to " + (
            f"{self.out_dir}.{adapter} Load and generate with:\n\n{self.usage}"
        )


def fold_latent_normalisation(vae: FrozenVAE, applies_shift: bool = False) -> AutoencoderKL | AutoencoderDC:
    """A float32 copy of ``vae``'s autoencoder with its per-channel latent statistics folded into the 1x1 convs.

    ``applies_shift``: the family's pipeline decodes ``latents / scaling_factor + shift_factor`` (SD3's, Flux's), so
    a VAE normalised by its ``shift_factor`` alone (their own VAEs, which have no quant convs) is kept as it is.

    Decode side, ``post_quant_conv(z * std + mean)`` = ``W' z + b'`` with ``W' = W diag(std)``, ``b' = W mean + b``.
    Encode side, the posterior's mean rows become ``(W h + b - mean) / std`` and its log-variance rows shift by
    ``-2 log std``. ``scaling_factor`` is kept (the pipeline divides by it); ``shift_factor`` and
    ``latents_mean``/``latents_std`` are removed because they now live in the weights.
    """
    autoencoder = copy.deepcopy(vae.autoencoder).float()
    mean = vae.latents_mean.flatten().double()
    std = vae.latents_std.flatten().double()
    shift = torch.tensor(float(autoencoder.config.get("shift_factor") or 0.0))  # float32, as the buffers
    if applies_shift and torch.all(vae.latents_mean == shift) and torch.all(std == 1):
        return autoencoder
    folded = ("latents_mean", "latents_std", "shift_factor")  # an AutoencoderDC has none of them: it only scales
    autoencoder.register_to_config(**{key: None for key in folded if key in autoencoder.config})
    if torch.all(mean == 0) and torch.all(std == 1):
        return autoencoder
    config = autoencoder.config
    if not (config.use_quant_conv and config.use_post_quant_conv):
        raise ConfigError(
            "vae.pretrained",
            str(getattr(config, "_name_or_path", "the run's VAE")),
            "its config has per-channel latent statistics (latents_mean/latents_std or shift_factor) that the "
            "diffusers PixArt pipeline does not apply, and with `use_quant_conv`/`use_post_quant_conv` false there "
            "is no 1x1 convolution to fold them into",
            "export from a run whose VAE keeps its quant convolutions, or apply the statistics yourself when "
            "decoding: `vae.decode(latents * std / scaling_factor + mean)`",
        )
    post, quant = autoencoder.post_quant_conv, autoencoder.quant_conv
    channels = mean.numel()
    with torch.no_grad():
        weight, bias = post.weight.double()[:, :, 0, 0], post.bias.double()
        post.bias.copy_(weight @ mean + bias)
        post.weight.copy_((weight * std[None, :])[:, :, None, None])
        weight, bias = quant.weight.double()[:, :, 0, 0].clone(), quant.bias.double().clone()
        weight[:channels] /= std[:, None]
        bias[:channels] = (bias[:channels] - mean) / std
        bias[channels:] -= 2 * std.log()
        quant.weight.copy_(weight[:, :, None, None])
        quant.bias.copy_(bias)
    return autoencoder


def exported_vae(vae: FrozenVAE, family: Family) -> ModelMixin:
    """A float32 copy of the run's autoencoder as ``family``'s pipeline decodes with it: as it is where the pipeline
    applies the config's own statistics (``Family.pipeline_normalises``), else with them folded in."""
    if family.pipeline_normalises:
        return copy.deepcopy(vae.autoencoder).float()
    return fold_latent_normalisation(vae, family.pipeline_applies_shift)


def clean_model(model: ModelMixin) -> ModelMixin:
    """A copy whose config holds only the model's own arguments: EMA checkpoints add ``decay``, ``power``, ...,
    and a loaded model's ``_name_or_path`` (the folder it came from: an absolute path) would be saved with it."""
    accepted = inspect.signature(type(model).__init__).parameters
    config = {key: value for key, value in model.config.items() if key in accepted}
    clean = type(model).from_config(config)
    clean.load_state_dict(model.state_dict())
    return clean.eval()


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(
            "out_dir", str(out_dir), "it is a file, and an export is a folder", "pass a folder's path as `out_dir=...`"
        )
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(
            "out_dir",
            str(out_dir),
            "it is a folder that already holds files, and an export never overwrites",
            "remove it first, or pass another `out_dir=...`",
        )


def _refuse_checkpoints_folder(out_dir: Path, run_dir: Path) -> None:
    """An export among the run's checkpoints would be read as a damaged checkpoint (passed over by every sample and
    resume, and set aside as an abandoned branch by one)."""
    checkpoints = (run_dir / CHECKPOINTS).resolve()
    if out_dir.resolve().is_relative_to(checkpoints):
        raise ConfigError(
            "out_dir",
            str(out_dir),
            f"it is inside the run's checkpoints folder ({checkpoints}), where the trainer reads every folder as one "
            "of its checkpoints",
            f"export beside them, e.g. into the default `{run_dir / 'export'}/CHECKPOINT` (leave `out_dir` out)",
        )


def _writer() -> str:
    """Who stages an export: the host, the process id and its start time (a reused pid starts at another time)."""
    process = psutil.Process()
    return f"{socket.gethostname()}-{process.pid}-{int(process.create_time())}"


def _writer_is_gone(host: str, pid: int, started: int) -> bool:
    """Whether the export that named a staging folder has ended. Another machine's (shared storage) cannot be
    checked from here, so it counts as running."""
    if host != socket.gethostname():
        return False
    try:
        return int(psutil.Process(pid).create_time()) != started
    except psutil.NoSuchProcess:
        return True


def remove_stale_staging(out_dir: Path) -> None:
    """Remove the staging folders that killed exports to ``out_dir`` left beside it: only folders named by
    ``_staging_dir`` for this ``out_dir`` whose export process has ended."""
    if not out_dir.parent.is_dir():
        return
    named = re.compile(re.escape(f".{out_dir.name}.partial-") + r"(?P<host>.+)-(?P<pid>\d+)-(?P<started>\d+)-\w+")
    stale = [
        path
        for path in out_dir.parent.iterdir()
        if path.is_dir()
        and (match := named.fullmatch(path.name))
        and _writer_is_gone(match["host"], int(match["pid"]), int(match["started"]))
    ]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)


def _staging_dir(out_dir: Path) -> Path:
    """An empty sibling of ``out_dir`` to write into, named after this process so that a later export can tell
    whether it was left behind; renamed at the end so a failed export leaves nothing half."""
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-{_writer()}-", dir=out_dir.parent))
    except OSError as error:
        raise ConfigError(
            "out_dir",
            str(out_dir),
            f"it cannot be written ({error.strerror or error})",
            "pass a writable `out_dir=...`",
        ) from error


def _cast(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    return module if dtype == torch.float32 else module.to(dtype)  # float32 already; .to() would only warn


def export_run(cfg: ExportConfig) -> ExportResult:
    """Write ``cfg.checkpoint`` of ``cfg.run_dir`` to ``cfg.out_dir`` (see the module docstring for the layouts).

    Everything that can be checked without loading models is checked first, and the folder is written under a
    staging name and renamed at the end: a refused or failed export leaves ``out_dir`` as it was.
    """
    check_sampling_args(cfg)
    run_dir = Path(cfg.run_dir).expanduser()
    train_cfg = read_run_config(run_dir)
    family = FAMILIES.get(train_cfg.model.family)
    if train_cfg.vae.kind == "pixel":
        raise ConfigError(
            "vae.kind",
            "pixel",
            f"the run {run_dir} diffuses in pixel space, and a diffusers {family.pipeline} (and this export's "
            "layout) needs an AutoencoderKL to decode latents",
            "generate with `scripts/sample.py` instead; the checkpoint's `transformer/` folder is already a "
            f"diffusers {family.transformer_class.__name__}",
        )
    sampler = cfg.sampler or train_cfg.diffusion.sampler
    check_sampler(train_cfg.diffusion.objective, sampler, "sampler")
    checkpoint = find_checkpoint(run_dir, cfg.checkpoint)
    out_dir = Path(cfg.out_dir).expanduser() if cfg.out_dir else run_dir / "export" / checkpoint.name
    _check_out_dir(out_dir)
    _refuse_checkpoints_folder(out_dir, run_dir)
    dtype = getattr(torch, cfg.dtype)

    remove_stale_staging(out_dir)
    staging = _staging_dir(out_dir)
    try:
        run = load_run(run_dir, str(checkpoint), cfg.ema, device="cpu")
        parts = run.text_to_image
        weights = weights_layout(train_cfg.lora.enabled).weights_dir(checkpoint, cfg.ema)
        transformer = run.dit.transformer
        if train_cfg.lora.enabled:  # a plain diffusers transformer: the base with the adapter merged in
            # the checkpoint weights a run started from another began with
            start = trained_start(train_cfg.model, train_cfg.trainer)
            base = (
                load_transformer(train_cfg.model)
                if start is None
                else load_trained_transformer(start, family.transformer_class)
            )
            transformer = merge_adapter(base, train_cfg.lora, weights, family.lora_targets)
        scheduler = parts.schedule.diffusers_sampler(sampler)
        exported = family.export(
            ExportParts(
                model=train_cfg.model,
                vae_kind=train_cfg.vae.kind,
                conditioner=train_cfg.conditioner,
                data=train_cfg.data,
                diffusion=train_cfg.diffusion,
                transformer=_cast(clean_model(transformer), dtype),
                vae=_cast(clean_model(exported_vae(parts.vae, family)), dtype),
                scheduler=scheduler,
                text_encoder=parts.text_encoder,
                pipeline=family.pipeline,
                dtype=cfg.dtype,
                latent_shape=parts.latent_shape,
            )
        )
        manifest = {
            "format": "dit-trainer export 1",
            "run_dir": os.path.relpath(run_dir.resolve(), out_dir.resolve()),  # from this folder
            "checkpoint": checkpoint.name,
            "weights": "ema" if weights.name.endswith("_ema") else "raw",
            "dtype": cfg.dtype,
            "pipeline": family.pipeline if exported.bundled else None,
            "pipeline_class": family.pipeline,
            "transformer_class": family.transformer_class.__name__,
            "scheduler_class": type(scheduler).__name__,
            "latents": f"the VAE's own per-channel statistics (vae/), which {family.pipeline} undoes itself before "
            "decoding"
            if family.pipeline_normalises
            else "per-channel normalisation folded into vae/ (quant_conv, post_quant_conv): decode with "
            f"vae.decode(latents / vae.config.scaling_factor), as {family.pipeline} does",
            **exported.manifest,
            "usage": exported.usage("."),  # wherever the folder is moved
        }
        exported.save(staging)
        if train_cfg.lora.enabled:
            manifest["lora"] = export_adapter(
                family.pipeline, train_cfg.model, train_cfg.lora, weights, staging, out_dir
            )
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        card_usage = exported.usage(cfg.push_to_hub or ".")  # loading the Hub repository, or the folder itself
        write_model_card(staging, train_cfg, manifest, card_usage, run_dir, checkpoint, cfg.push_to_hub)
        _publish(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    record_export(run_dir, out_dir)
    return ExportResult(out_dir, exported.bundled, manifest, exported.usage(str(out_dir)))


def _publish(staging: Path, out_dir: Path) -> None:
    """Put the finished export in place in one step, flushed and with the user's umask (``durable.publish``): a POSIX
    rename replaces a missing or empty ``out_dir`` atomically, and fails on one that another process filled
    meanwhile, which is then refused as at the start."""
    fsync_tree(staging)
    try:
        publish(staging, out_dir)
    except OSError:
        _check_out_dir(out_dir)
        raise
