"""Loading a trained run back for sampling: the run's own config rebuilds the frozen components and schedule."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

import torch

from dit_trainer.components.build import build_components
from dit_trainer.components.dit import DiTAdapter
from dit_trainer.components.lora import base_weights, changed_base, load_adapter
from dit_trainer.config import SampleConfig, TrainConfig, call_with_sections, check_fields
from dit_trainer.config.scripts import RunCheckpointArgs
from dit_trainer.data.sources.videofolder import write_mp4
from dit_trainer.diffusion import SAMPLERS
from dit_trainer.diffusion.checks import check_sampler
from dit_trainer.diffusion.sampler import SamplerSettings, TextToImage
from dit_trainer.errors import ConfigError, require, shortlist
from dit_trainer.images import to_pil
from dit_trainer.prompts import load_prompts
from dit_trainer.run_config import read_run_config
from dit_trainer.runs.run_folder import (
    WeightsLayout,
    check_writable_folder,
    find_checkpoint,
    other_kind_only,
    read_manifest,
    weights_layout,
)

logger = logging.getLogger(__name__)
SAMPLE_INDEX = "index.jsonl"
VIDEO_FPS = 16.0  # a video run's sample clips without `data.fps`: Wan's rate


@dataclass
class TrainedRun:
    """Everything needed to generate images from one checkpoint of a run."""

    cfg: TrainConfig
    checkpoint: Path
    dit: DiTAdapter
    text_to_image: TextToImage
    ema: bool = False  # whether the EMA weights were loaded (asked for, and saved in the checkpoint)

    def settings(
        self, steps: int | None = None, guidance_scale: float | None = None, sampler: str | None = None
    ) -> SamplerSettings:
        """Sampler settings: the run's own ``diffusion.*`` values where an argument is None; a ``sampler`` that does
        not sample the run's objective is a ``ConfigError`` naming it."""
        diffusion = self.cfg.diffusion
        if sampler is not None:
            check_sampler(diffusion.objective, sampler, "sampler")
        return SamplerSettings(
            steps or diffusion.sample_steps,
            diffusion.guidance_scale if guidance_scale is None else guidance_scale,
            sampler or diffusion.sampler,
        )

    def at_size(self, height: int | None, width: int | None) -> TrainedRun:
        """This run generating ``height`` x ``width`` images (either None: the run's ``data.resolution``); a side
        that the latent would not cut into whole patches, or that the transformer has no positions for (SD3's
        table), is a ``ConfigError`` naming it."""
        resolution, vae, family = self.cfg.data.resolution, self.text_to_image.vae, self.dit.family
        multiple = vae.downsample_factor * family.latents_per_token(self.dit.transformer.config)
        height, width = height or resolution, width or resolution
        if family.largest_latent_of is not None:
            largest = family.largest_latent_of(self.dit.transformer.config) * vae.downsample_factor
            key, side = max((("height", height), ("width", width)), key=lambda pair: pair[1])
            require(
                side <= largest,
                key,
                side,
                f"the transformer has positions for at most {largest} px on a side (its positional table)",
                f"set `{key}={largest}` or less",
            )
        for key, side in (("height", height), ("width", width)):
            if side % multiple:
                lower = side // multiple * multiple
                nearest = f"`{key}={lower}` or `{key}={lower + multiple}`" if lower else f"`{key}={multiple}`"
                raise ConfigError(
                    key,
                    side,
                    f"it must be a multiple of {multiple} (the VAE's downsampling factor x the DiT's patch size)",
                    f"set {nearest}",
                )
        factor = vae.downsample_factor
        latent_shape = (*self.text_to_image.latent_shape[:-2], height // factor, width // factor)  # clips: frames kept
        return dataclasses.replace(
            self, text_to_image=dataclasses.replace(self.text_to_image, latent_shape=latent_shape)
        )

    def generate_images(
        self, prompts: list[str], seeds: list[int], settings: SamplerSettings, batch_size: int = 32
    ) -> torch.Tensor:
        """Images (B, 3, H, W) in [0, 1]."""
        return self.text_to_image(self.dit, prompts, seeds, settings, batch_size)


def check_sampling_args(cfg: RunCheckpointArgs) -> None:
    """A script's own arguments, before any run is read: the field checks, and a sampler dit-trainer knows."""
    check_fields(cfg)
    if cfg.sampler is not None:
        SAMPLERS.check(cfg.sampler, "sampler")


def require_own_kind(checkpoint: Path, layout: WeightsLayout) -> None:
    """A checkpoint of the other kind (LoRA adapters given for a run that trained the whole DiT, or the reverse) is
    another run's, named as such rather than as a folder without weights."""
    other = other_kind_only(checkpoint, layout)
    if other is not None:
        raise ConfigError(
            "checkpoint",
            str(checkpoint),
            f"it holds {other.what} (`{other.directory}/`), and the run whose config is read trained {layout.what}: "
            "it is another run's checkpoint",
            "pass one of this run's checkpoints (`checkpoint=latest`), or the folder of the run that wrote it",
        )


def require_safetensors(checkpoint: Path, weights: Path) -> None:
    """Checkpoint weights are read as safetensors only: train.py writes nothing else, and unpickling a ``.bin``
    someone put there can run code (``torch.load``'s ``weights_only`` guard was bypassable before torch 2.6)."""
    if not any(weights.glob("*.safetensors")):
        raise ConfigError(
            "checkpoint",
            str(checkpoint),
            f"its weights folder {weights} holds no .safetensors file (train.py writes weights only as safetensors, "
            "and a pickled .bin is not loaded: unpickling can run code)",
            "pass a checkpoint folder that train.py wrote, e.g. `checkpoint=latest`; to use weights you trust that "
            "exist only as a .bin, convert them to safetensors first",
        )


def load_run(
    run_dir: str | Path, checkpoint: str = "latest", ema: bool = True, device: str | None = None
) -> TrainedRun:
    """Rebuild a run from its folder: its config, one checkpoint's DiT (EMA weights by default), the frozen parts."""
    run_dir = Path(run_dir).expanduser()
    cfg = read_run_config(run_dir)
    path = find_checkpoint(run_dir, checkpoint)
    layout = weights_layout(cfg.lora.enabled)
    require_own_kind(path, layout)
    weights = layout.weights_dir(path, ema)
    require_safetensors(path, weights)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    if cfg.lora.enabled:  # the base model, adapters injected, then the checkpoint's adapter weights
        warn_of_another_base(path, cfg)
        parts = call_with_sections(build_components, cfg, device=device, frozen_dtype=dtype)
        load_adapter(parts.dit.transformer, weights)
    else:  # the checkpoint's folder is a whole diffusers transformer
        parts = call_with_sections(build_components, cfg, device=device, frozen_dtype=dtype, dit_weights=weights)
    text_to_image = TextToImage(parts.vae, parts.text_encoder, parts.schedule, parts.latent_shape, device)
    loaded_ema = weights.name.endswith("_ema")
    return TrainedRun(cfg, path, parts.dit.to(device, dtype).eval(), text_to_image, loaded_ema)


def warn_of_another_base(checkpoint: Path, cfg: TrainConfig) -> None:
    """LoRA adapters applied to other base weights than they trained on make another model: said, not refused (a
    user may mean to carry adapters over to an updated base)."""
    if changed_base(read_manifest(checkpoint).get("base_weights"), base_weights(cfg.model, cfg.lora)):
        logger.warning(
            f"The LoRA adapters of {checkpoint} trained on other base weights than those now at "
            f"`model.pretrained={cfg.model.pretrained}` (their files changed since): the images come from the "
            "adapters on the new base. Put back the base the run trained on to see what it learned."
        )


@contextlib.contextmanager
def new_file(path: Path, binary: bool = True, command: str = "sampling") -> Iterator[IO]:
    """``path`` created for writing, never replacing a file (``refuse_overwrite`` looked before any model loaded;
    a file another command wrote there since, two commands given one folder, is the same refusal)."""
    try:
        file = path.open("xb") if binary else path.open("x", encoding="utf-8")
    except FileExistsError as error:
        raise ConfigError(
            "out_dir",
            str(path.parent),
            f"it holds {path.name}, which another command wrote there while this one ran, and {command} never "
            "overwrites",
            "give each command its own `out_dir`",
        ) from error
    with file:
        try:
            yield file
        except BaseException:
            path.unlink()  # what this command began: a half-written file would block its own rerun
            raise


def refuse_overwrite(
    out_dir: Path, names: list[str], command: str = "sampling", kept_if_done: str | None = None
) -> None:
    """Sampling (and evaluating) never replaces a file: images in ``out_dir`` may be all that is left of an earlier
    run or checkpoint. Checked before any model loads, so a refused command costs nothing. ``kept_if_done``: the
    file the command keeps only when it finishes (sample.py's index); other files without it are a stopped run's."""
    check_writable_folder(out_dir, "out_dir")
    taken = [name for name in names if (out_dir / name).exists() or (out_dir / name).is_symlink()]
    if taken:
        listed = shortlist(taken, 3)
        stopped = kept_if_done is not None and kept_if_done not in taken
        raise ConfigError(
            "out_dir",
            str(out_dir),
            f"it already holds {listed}, which this command would write, and {command} never overwrites"
            + (f" (with no {kept_if_done}: what a {command} that was stopped leaves)" if stopped else ""),
            "pass a new folder, e.g. `out_dir=samples/run2`, or move those files away first"
            + (" (a stopped run's files may be deleted: the same command writes them all again)" if stopped else ""),
        )


def save_sample(sample: torch.Tensor, file: BinaryIO, fps: float) -> None:
    """An image (3, H, W) in [0, 1] as a PNG, or a clip (3, F, H, W) as an H.264 MP4 at ``fps``."""
    if sample.ndim == 3:
        to_pil(sample).save(file, format="PNG")
        return
    frames = (sample.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 3, 0).cpu().numpy()
    write_mp4(frames, file, fps)


def sample_to_folder(cfg: SampleConfig) -> Path:
    """Write one PNG per image (an MP4 per clip, for a video run) and ``index.jsonl`` (``{"file", "prompt", "seed"}``
    per image) into ``out_dir``, none of whose files are replaced (files are created exclusively). Image ``j`` of
    every prompt has seed ``seed + j``, as in ``evaluate.py`` and the monitors: a prompt's images do not depend on
    the other prompts. A prompt listed again continues its seeds (more images of it, not copies)."""
    check_sampling_args(cfg)
    prompts = load_prompts(cfg.prompts, cfg.prompt_file)
    listed: Counter[str] = Counter()
    jobs = []
    for prompt in prompts:
        first = cfg.seed + cfg.images_per_prompt * listed[prompt]
        jobs += [(prompt, first + j) for j in range(cfg.images_per_prompt)]
        listed[prompt] += 1
    data = read_run_config(Path(cfg.run_dir).expanduser()).data
    suffix, fps = ("mp4", data.fps or VIDEO_FPS) if data.frames > 1 else ("png", 0.0)
    names = [f"{index:05d}.{suffix}" for index in range(len(jobs))]
    out_dir = Path(cfg.out_dir).expanduser()
    refuse_overwrite(out_dir, [SAMPLE_INDEX, *names], "sample.py", kept_if_done=SAMPLE_INDEX)
    run = load_run(cfg.run_dir, cfg.checkpoint, cfg.ema).at_size(cfg.height, cfg.width)
    run.text_to_image.text_encoder.check_prompts(prompts)  # a prompt it refuses fails before any file is written
    settings = run.settings(cfg.steps, cfg.guidance_scale, cfg.sampler)
    out_dir.mkdir(parents=True, exist_ok=True)
    with new_file(out_dir / SAMPLE_INDEX, binary=False) as index_file:
        for start in range(0, len(jobs), cfg.batch_size):
            batch = jobs[start : start + cfg.batch_size]
            images = run.generate_images([p for p, _ in batch], [s for _, s in batch], settings, cfg.batch_size)
            for name, (prompt, seed), image in zip(names[start:], batch, images):
                with new_file(out_dir / name) as file:
                    save_sample(image, file, fps)
                index_file.write(json.dumps({"file": name, "prompt": prompt, "seed": seed}) + "\n")
    return out_dir
