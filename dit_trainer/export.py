"""Export one checkpoint of a run for the diffusers ecosystem (``scripts/export.py``).

Two layouts, chosen by the run's text encoder:

- **T5 runs** (``T5EncoderModel``, as PixArt) become a complete folder of the model family's pipeline
  (``PixArtAlphaPipeline``, ``PixArtSigmaPipeline``: ``transformer/``, ``vae/``, ``text_encoder/``, ``tokenizer/``,
  ``scheduler/``, ``model_index.json``), so ``PixArtAlphaPipeline.from_pretrained(folder)`` generates images with no
  dit-trainer installed.
- **Class-conditional runs** (``model.family=dit``) become a ``DiTPipeline`` folder (``transformer/``, ``vae/``,
  ``scheduler/``); the class names are in the manifest (``DiTPipeline`` takes class ids).
- **Other text encoders** (the shapes default's MiniLM/BERT, CLIP) are not copied: the folder holds
  ``transformer/``, ``vae/`` and ``scheduler/`` in diffusers format, and ``dit_trainer_export.json`` names the text
  encoder (id or path, subfolders, ``max_length``). ``PixArtAlphaPipeline`` only calls
  ``text_encoder(input_ids, attention_mask=mask)[0]``, which is the last hidden state our ``FrozenTextEncoder``
  conditions on, so the pieces assemble into the same pipeline class (the JSON's ``usage`` shows how).

Both layouts write ``dit_trainer_export.json``: which checkpoint and weights (EMA or raw), the dtype, and the
generation settings that reproduce the run's sampler (``max_sequence_length`` must be the run's
``text_encoder.max_length``; resolution binning must be off for sample sizes other than PixArt's own). Its paths are
relative to the export folder (``run_dir``, the ``usage`` snippet's ``folder``), so an export moved with or without
its run stays self-describing.

The folder is written under a staging name beside ``out_dir`` (``.NAME.partial-HOST-PID-START-XXXX``) and renamed in
one step when complete. A killed export leaves its staging folder behind; the next export to the same ``out_dir``
removes those whose process is gone, and nothing else.

Latent normalisation is folded into the exported VAE. ``FrozenVAE`` normalises latents per channel,
``(z - mean) * scaling_factor / std``, but ``PixArtAlphaPipeline`` decodes ``latents / vae.config.scaling_factor``
with no per-channel statistics and no shift. Both are affine maps per channel, and the autoencoder's 1x1
``post_quant_conv`` (decode side) and ``quant_conv`` (encode side) are affine too, so the statistics are folded
into those convolutions exactly and dropped from the exported config. The exported VAE then speaks the
normalised latent space divided by ``scaling_factor``: ``decode(z / scaling_factor)`` is ``FrozenVAE.decode(z)``
and ``encode(x).latent_dist.mean * scaling_factor`` is ``FrozenVAE.encode(x)``.
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

import diffusers
import psutil
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ModelMixin
from transformers import T5EncoderModel

from dit_trainer.components import load_transformer, merge_adapter
from dit_trainer.components.families import FAMILIES
from dit_trainer.components.vae import FrozenVAE
from dit_trainer.config import ExportConfig, TrainConfig, check_fields
from dit_trainer.errors import ConfigError
from dit_trainer.inference import find_checkpoint, load_run
from dit_trainer.run_folder import read_run_config, weights_format

MANIFEST = "dit_trainer_export.json"
DIT_PIPELINE_CLASSES = 1000  # DiTPipeline's null class id is 1000: ImageNet's class count


@dataclass
class ExportResult:
    out_dir: Path
    pipeline: bool  # True: a folder of the family's pipeline; False: transformer/vae/scheduler + the manifest
    manifest: dict
    usage: str  # the manifest's usage with ``folder`` set to ``out_dir`` as given: what to paste now

    @property
    def message(self) -> str:
        kind = (
            f"a {self.manifest['pipeline']} folder"
            if self.pipeline
            else "transformer/, vae/, scheduler/ and " + MANIFEST
        )
        return f"Exported {self.manifest['checkpoint']} ({self.manifest['weights']} weights) as {kind} to " + (
            f"{self.out_dir}. Load and generate with:\n\n{self.usage}"
        )


def fold_latent_normalisation(vae: FrozenVAE) -> AutoencoderKL:
    """A float32 copy of ``vae``'s autoencoder with its per-channel latent statistics folded into the 1x1 convs.

    Decode side, ``post_quant_conv(z * std + mean)`` = ``W' z + b'`` with ``W' = W diag(std)``, ``b' = W mean + b``.
    Encode side, the posterior's mean rows become ``(W h + b - mean) / std`` and its log-variance rows shift by
    ``-2 log std``. ``scaling_factor`` is kept (the pipeline divides by it); ``shift_factor`` and
    ``latents_mean``/``latents_std`` are removed because they now live in the weights.
    """
    autoencoder = copy.deepcopy(vae.autoencoder).float()
    mean = vae.latents_mean.flatten().double()
    std = vae.latents_std.flatten().double()
    autoencoder.register_to_config(latents_mean=None, latents_std=None, shift_factor=None)
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


def clean_transformer(transformer: ModelMixin) -> ModelMixin:
    """A copy whose config holds only the model's own arguments (EMA checkpoints add ``decay``, ``power``, ...)."""
    accepted = inspect.signature(type(transformer).__init__).parameters
    config = {key: value for key, value in transformer.config.items() if key in accepted}
    clean = type(transformer).from_config(config)
    clean.load_state_dict(transformer.state_dict())
    return clean.eval()


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(
            "out_dir",
            str(out_dir),
            "it already exists and is not an empty folder, and an export never overwrites",
            "remove it first, or pass another `out_dir=...`",
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


def _kwargs(**values) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in values.items() if value is not None)


# The PixArt pipelines predate flow matching: they scale the first latents by the scheduler's ``init_noise_sigma`` and
# calls ``scale_model_input``, which FlowMatchEulerDiscreteScheduler lacks. For flow matching both are the identity,
# so the printed recipe supplies them (the exported pipeline then reproduces our sampler).
FLOW_MATCHING_PATCH = (
    "# The PixArt pipelines predate flow matching: give the scheduler the two identity members they expect\n"
    "pipe.scheduler.init_noise_sigma = 1.0\n"
    "pipe.scheduler.scale_model_input = lambda sample, timestep=None: sample\n"
)


def _usage(folder: str, cfg: TrainConfig, manifest: dict, text_encoder_class: str | None) -> str:
    """Python that loads the export in ``folder`` and generates an image as our sampler would."""
    generation, pipeline, transformer = (manifest[key] for key in ("generation", "pipeline_class", "transformer_class"))
    if "classes" in manifest:
        first = manifest["classes"]["names"][0]
        return (
            f"from diffusers import {pipeline}\n\npipe = {pipeline}.from_pretrained({folder!r})\n"
            f"image = pipe(class_labels=[0], num_inference_steps={generation['num_inference_steps']}, "
            f"guidance_scale={generation['guidance_scale']}).images[0]  # class 0: {first!r}"
        )
    patch = FLOW_MATCHING_PATCH if manifest["scheduler_class"] == FlowMatchEulerDiscreteScheduler.__name__ else ""
    call = patch + (
        f'image = pipe("a red circle", height={generation["height"]}, width={generation["width"]}, '
        f"num_inference_steps={generation['num_inference_steps']}, guidance_scale={generation['guidance_scale']},\n"
        f"             max_sequence_length={generation['max_sequence_length']}, use_resolution_binning=False, "
        "clean_caption=False).images[0]"
    )
    dtype = manifest["dtype"]
    cast = dtype != "float32"
    imports, to_dtype = ("import torch\n", f".to(torch.{dtype})") if cast else ("", "")
    torch_dtype = f", torch_dtype=torch.{dtype}" if cast else ""
    if text_encoder_class is None:
        return (
            f"{imports}from diffusers import {pipeline}\n\n"
            f"pipe = {pipeline}.from_pretrained({folder!r}{torch_dtype})"
            f"\n{call}"
        )
    te = cfg.text_encoder
    te_args = _kwargs(subfolder=te.subfolder, revision=te.revision)
    tok_args = _kwargs(subfolder=te.tokenizer_subfolder, revision=te.revision)
    scheduler = manifest["scheduler_class"]
    return (
        f"{imports}from diffusers import AutoencoderKL, {scheduler}, {pipeline}, "
        f"{transformer}\nfrom transformers import AutoTokenizer, {text_encoder_class}\n\n"
        f"folder, text_encoder = {folder!r}, {te.pretrained!r}\n"
        f"pipe = {pipeline}(\n"
        f"    tokenizer=AutoTokenizer.from_pretrained(text_encoder{', ' + tok_args if tok_args else ''}),\n"
        f"    text_encoder={text_encoder_class}.from_pretrained(text_encoder{', ' + te_args if te_args else ''}),\n"
        f'    transformer={transformer}.from_pretrained(folder, subfolder="transformer"),\n'
        '    vae=AutoencoderKL.from_pretrained(folder, subfolder="vae"),\n'
        f'    scheduler={scheduler}.from_pretrained(folder, subfolder="scheduler"),\n'
        f"){to_dtype}\n{call}"
    )


def _text_conditioning(cfg: TrainConfig, text_encoder, bundled: bool) -> dict:
    """The manifest's text encoder (bundled in the folder, or named) and the pipeline call that reproduces our
    sampler."""
    te = cfg.text_encoder
    return {
        "text_encoder": {
            "bundled": bundled,
            "pretrained": "text_encoder" if bundled else te.pretrained,
            "subfolder": None if bundled else te.subfolder,
            "tokenizer_subfolder": "tokenizer" if bundled else te.tokenizer_subfolder,
            "revision": None if bundled else te.revision,
            "class": type(text_encoder.model).__name__,
            "max_length": te.max_length,
            "conditioning": "last_hidden_state and attention_mask of the prompt tokenized with "
            "padding='max_length', truncation=True, max_length=max_length; the empty prompt '' is the "
            "unconditional branch of classifier-free guidance",
        },
        "generation": {
            "height": cfg.data.resolution,
            "width": cfg.data.resolution,
            "num_inference_steps": cfg.diffusion.sample_steps,
            "guidance_scale": cfg.diffusion.guidance_scale,
            "negative_prompt": "",
            "max_sequence_length": te.max_length,
            "use_resolution_binning": False,
            "clean_caption": False,
        },
    }


def _class_conditioning(cfg: TrainConfig) -> dict:
    """The manifest's classes (id = position; the null class, CFG's unconditional branch, is the next id) and the
    pipeline call. ``DiTPipeline`` takes class 1000 as the null class, so its guidance matches ours only for
    1,000-class models; with other class counts it generates as ours does at ``guidance_scale=1``."""
    classes = cfg.text_encoder.classes
    guidance = cfg.diffusion.guidance_scale if len(classes) == DIT_PIPELINE_CLASSES else 1.0
    return {
        "classes": {"names": classes, "null_class": len(classes)},
        "generation": {"num_inference_steps": cfg.diffusion.sample_steps, "guidance_scale": guidance},
    }


def export_run(cfg: ExportConfig) -> ExportResult:
    """Write ``cfg.checkpoint`` of ``cfg.run_dir`` to ``cfg.out_dir`` (see the module docstring for the layouts).

    Everything that can be checked without loading models is checked first, and the folder is written under a
    staging name and renamed at the end: a refused or failed export leaves ``out_dir`` as it was.
    """
    check_fields(cfg)
    run_dir = Path(cfg.run_dir).expanduser()
    train_cfg = read_run_config(run_dir)
    family = FAMILIES[train_cfg.model.family]
    if train_cfg.vae.kind == "pixel":
        raise ConfigError(
            "vae.kind",
            "pixel",
            f"the run {run_dir} diffuses in pixel space, and a diffusers {family.pipeline} (and this export's "
            "layout) needs an AutoencoderKL to decode latents",
            "generate with `scripts/sample.py` instead; the checkpoint's `transformer/` folder is already a "
            f"diffusers {family.transformer_class.__name__}",
        )
    checkpoint = find_checkpoint(run_dir, cfg.checkpoint)
    out_dir = Path(cfg.out_dir).expanduser() if cfg.out_dir else run_dir / "export" / checkpoint.name
    _check_out_dir(out_dir)
    sampler = cfg.sampler or train_cfg.diffusion.sampler
    dtype = getattr(torch, cfg.dtype)

    remove_stale_staging(out_dir)
    staging = _staging_dir(out_dir)
    try:
        run = load_run(run_dir, str(checkpoint), cfg.ema, device="cpu")
        parts = run.text_to_image
        weights = weights_format(train_cfg.lora.enabled).weights_dir(checkpoint, cfg.ema)
        transformer = run.dit.transformer
        if train_cfg.lora.enabled:  # a plain diffusers transformer: the base with the adapter merged in
            transformer = merge_adapter(load_transformer(train_cfg.model), train_cfg.lora, weights)
        transformer = _cast(clean_transformer(transformer), dtype)
        vae = _cast(fold_latent_normalisation(parts.vae), dtype)
        scheduler = parts.schedule.diffusers_sampler(sampler)
        text_encoder = parts.text_encoder
        classes = family.condition == "class"
        bundled = classes or isinstance(text_encoder.model, T5EncoderModel)  # a whole pipeline folder
        manifest = {
            "format": "dit-trainer export 1",
            "run_dir": os.path.relpath(run_dir.resolve(), out_dir.resolve()),  # from this folder
            "checkpoint": checkpoint.name,
            "weights": "ema" if weights.name.endswith("_ema") else "raw",
            "dtype": cfg.dtype,
            "pipeline": family.pipeline if bundled else None,
            "pipeline_class": family.pipeline,
            "transformer_class": family.transformer_class.__name__,
            "scheduler_class": type(scheduler).__name__,
            "latents": "per-channel normalisation folded into vae/ (quant_conv, post_quant_conv): decode with "
            f"vae.decode(latents / vae.config.scaling_factor), as {family.pipeline} does",
            **(_class_conditioning(train_cfg) if classes else _text_conditioning(train_cfg, text_encoder, bundled)),
        }
        text_encoder_class = None if bundled else type(text_encoder.model).__name__
        manifest["usage"] = _usage(".", train_cfg, manifest, text_encoder_class)  # wherever the folder is moved
        pipeline_class = getattr(diffusers, family.pipeline)
        if classes:
            pipeline_class(transformer=transformer, vae=vae, scheduler=scheduler).save_pretrained(staging)
        elif bundled:
            pipeline = pipeline_class(
                tokenizer=text_encoder.tokenizer,
                text_encoder=_cast(text_encoder.model, dtype),
                vae=vae,
                transformer=transformer,
                scheduler=scheduler,
            )
            pipeline.save_pretrained(staging)
        else:
            transformer.save_pretrained(staging / "transformer")
            vae.save_pretrained(staging / "vae")
            scheduler.save_pretrained(staging / "scheduler")
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        _publish(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportResult(out_dir, bundled, manifest, _usage(str(out_dir), train_cfg, manifest, text_encoder_class))


def _publish(staging: Path, out_dir: Path) -> None:
    """Put the finished export in place in one step: a POSIX rename replaces a missing or empty ``out_dir``
    atomically, and fails on one that another process filled meanwhile, which is then refused as at the start."""
    try:
        os.replace(staging, out_dir)
    except OSError:
        _check_out_dir(out_dir)
        raise
