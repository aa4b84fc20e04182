"""The command lines of the scripts that work on a finished run (``sample``, ``evaluate``, ``export``), and
``preview_data``'s own arguments: one dataclass each, on shared bases whose field checks are written once
(``check_fields`` runs them on parsing)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from dit_trainer.config.choices import FID_FEATURES
from dit_trainer.config.fields import at_least, checked, one_of

EXPORT_DTYPES = ("float32", "bfloat16", "float16")
EVALUATION_METRICS = ("rewards", "fid")


@dataclass
class RunCheckpointArgs:
    """Which weights of which run: a run folder (train.py's ``hydra.run.dir``) and one of its checkpoints."""

    run_dir: str = MISSING
    checkpoint: str = "latest"  # latest | a name the run kept one under (best_gold) | path to a checkpoint folder
    ema: bool = True  # use the EMA weights when the checkpoint has them
    # ddim | dpmsolver++ (epsilon / v runs) | euler (flow matching), checked against the run's objective; default:
    # the run's diffusion.sampler
    sampler: str | None = None


# Not any size >= 1: one the run's pixel grid (the VAE's downsampling x the DiT's patch) divides, as its own are.
IMAGE_SIDE = "set a side the run trained at (its `data.resolution`, or a bucket's), or leave `{key}` out for the run's"


@dataclass
class SamplingArgs(RunCheckpointArgs):
    """Images from a run: ``images_per_prompt`` per prompt, image ``j`` of every prompt with seed ``seed + j``."""

    prompt_file: str | None = None  # one prompt per line
    prompts: list[str] = field(default_factory=list)  # used when no prompt_file is given
    images_per_prompt: int = at_least(1, 4)
    seed: int = 0
    steps: int | None = at_least(1, None)  # default: the run's diffusion.sample_steps
    guidance_scale: float | None = at_least(0, None, "set e.g. `{key}=3.0`, or leave it out for the run's own")
    batch_size: int = at_least(1, 32)
    # The image size in pixels (e.g. a bucket the run trained on); null: the run's data.resolution
    height: int | None = at_least(1, None, IMAGE_SIDE)
    width: int | None = at_least(1, None, IMAGE_SIDE)


@dataclass
class SampleConfig(SamplingArgs):
    """``scripts/sample.py``: one PNG per image (an MP4 per clip, for a video run) and ``index.jsonl`` in
    ``out_dir``."""

    out_dir: str = MISSING


@dataclass
class EvaluateConfig(SamplingArgs):
    """``scripts/evaluate.py``: score a run's samples with the rewards it was configured with. Prompts default to
    the run's monitor.reward prompts (shapes: all captions)."""

    out_dir: str | None = None  # default: RUN_DIR/eval/<checkpoint name>
    # rewards: the prompts x images_per_prompt samples scored with the rewards; fid: FID and KID of one sample per
    # validation image (its caption, seed + i) against the run's validation images
    metrics: list[str] = checked(
        lambda names: bool(names) and set(names) <= set(EVALUATION_METRICS),
        f"it must list some of {', '.join(EVALUATION_METRICS)}",
        "set e.g. `metrics=[rewards,fid]`",
        default_factory=lambda: ["rewards"],
    )
    # Score with these rewards (name -> weight) instead of the run's `reward.weights`: weights.clip_score=1.0 ...
    weights: dict[str, float] = field(default_factory=dict)
    clip_model: str | None = None  # instead of the run's reward.clip_model
    # inception: the standard FID features (needs torch-fidelity); vae: the run's own VAE encoder (offline; compare
    # only runs that share the VAE)
    fid_features: str = one_of(FID_FEATURES, "inception")
    # For machines without internet: a local copy of torch-fidelity's Inception weights (the file its
    # URL_INCEPTION_V3 names, weights-inception-2015-12-05-6726825d.pth); null: downloaded once and cached
    fid_weights: str | None = None
    fid_images: int | None = at_least(2, None, note="null: one per validation image")  # samples generated
    # Where the validation images' features are cached: null is RUN's data.cache_dir/fid_reference, or without
    # one RUN/fid_reference (where the run's FID monitor kept them)
    fid_cache_dir: str | None = None


@dataclass
class ExportConfig(RunCheckpointArgs):
    """``scripts/export.py``: a checkpoint as the family's diffusers pipeline folder (``DiffusionPipeline.
    from_pretrained`` loads it), with a LoRA run's adapter alone in ``lora/`` where the pipeline can load it."""

    out_dir: str | None = None  # default: RUN_DIR/export/<checkpoint name>
    dtype: str = one_of(EXPORT_DTYPES, "float32")  # the dtype the weights are saved in
    # A Hub repository (`user/name`) to upload the export to, created if need be (needs a token: `hf auth login` or
    # HF_TOKEN; refused with HF_HUB_OFFLINE=1). Every export has its model card (README.md) either way.
    push_to_hub: str | None = None
    hub_private: bool = True  # a repository created by push_to_hub is private; false: public


@dataclass
class PreviewConfig:
    """``scripts/preview_data.py``'s own arguments (the rest are train.py's overrides): ``n`` items of the training
    data as the model sees them, written to ``out_dir``, whose files are never replaced."""

    out_dir: str | None = None  # required
    n: int = at_least(1, 64)  # items to write
