"""What one throughput subprocess of the GPU check measures: the bare step or the trainer's step of one model, in
one variant (eager, compiled, gradient checkpointing), over a sweep of batch sizes, from a synthetic cache.

The cache holds random posteriors and text embeddings of the real shapes (SD-VAE latents 4 x 32 x 32 at 256 px,
T5-XXL's 120 x 4096; class ids for DiT), written in the cache's own format so that the trainer reads it exactly as
a precomputed one: no VAE or text encoder runs, and none has to be downloaded (the VAE is a small random stand-in
with the SD VAE's 8x downsampling, which a cached run only loads). Within the process the batches run smallest
first; the peak memory of each is reset before it starts, and the first that runs out of memory (or that the memory
check refuses: "refused") ends the sweep, the smaller batches' results kept.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from dit_trainer.apps.benchmark import time_steps
from dit_trainer.apps.gpu_check.assets import Assets
from dit_trainer.apps.gpu_check.online import ONLINE_METHODS, online_steps
from dit_trainer.assemble import build_trainer, open_run_cache, plan_run
from dit_trainer.components.build import build_components
from dit_trainer.components.compile import compile_blocks
from dit_trainer.components.dit import DiTAdapter, build_dit
from dit_trainer.components.meta import count_flops
from dit_trainer.condition import Condition
from dit_trainer.config import TrainConfig, call_with_sections
from dit_trainer.data.cache.cache import (
    INDEX,
    PROMPTS,
    save_shard,
    shard_name,
)
from dit_trainer.data.cache.fingerprint import cache_fingerprint
from dit_trainer.data.sources.shapes import CAPTIONS
from dit_trainer.errors import ConfigError
from dit_trainer.methods import method_of
from dit_trainer.precision import resolve_mixed_precision, weight_dtype
from dit_trainer.run_config import compose_train_config
from dit_trainer.training.optim import build_optimizer

# model -> the recipe it is trained with (DiT-XL/2: the paper's class-conditional model; PixArt-XL/2: experiment=dit)
RECIPES = {
    "pixart_xl_2": ["+experiment=dit", "data.buckets=none"],
    # A disk cache of class-conditional data is refused, so DiT trains from latents cached in memory at start-up
    # (the stand-in VAE encodes generated shapes once); its classes are the shapes' captions (the label table's size
    # costs nothing measurable).
    "dit_xl_2": ["+experiment=dit_imagenet", "data.source=shapes", "data.horizontal_flip=false",
                 "data.cache_latents=true", "trainer.sample_prompts=[0]",
                 "conditioner.classes=[" + ",".join(f"'{caption}'" for caption in CAPTIONS) + "]"],
}  # fmt: skip
T5_XXL_WIDTH = 4096
TINY = ["model.num_layers=2", "model.num_attention_heads=2", "model.attention_head_dim=16", "data.resolution=64",
        "conditioner.max_length=8", "data.num_workers=0"]  # fmt: skip
TINY_WIDTH = 32
# variant -> the trainer's overrides. The levers toward higher MFU, each one switch: regional compile with static
# shapes, gradient checkpointing of every block or of every 2nd (selective), gradient accumulation (2 micro-batches:
# the images per update of checkpointing at twice the batch, without recomputation), FP8 matmuls (compiled, as FP8
# is only fast fused), fused q/k/v projections.
VARIANT_OVERRIDES = {
    "eager": [],
    "compile": ["trainer.compile=true"],
    "checkpointing": ["trainer.gradient_checkpointing=true"],
    "selective": ["trainer.gradient_checkpointing=true", "trainer.gradient_checkpointing_every=2"],
    "accumulation": ["trainer.gradient_accumulation_steps=2"],
    "fp8": ["precision.fp8=true", "trainer.compile=true"],
    "fused_qkv": ["trainer.fused_qkv=true"],
}
VARIANTS = tuple(VARIANT_OVERRIDES)
BARE_VARIANTS = ("eager", "compile")  # the bare step: a ceiling for the trainer's eager and compiled rows
# (batch size, what closes the trainers it builds at the row's end) -> one training step at that size
StepMaker = Callable[[int, ExitStack], Callable[[], object]]
# a row's mixed precision, the DiT's training FLOPs per image (None: not counted), the SDPA kernels and its steps
Prepared = tuple[str, float | None, list[str], StepMaker]


@dataclass(frozen=True)
class Job:
    """One throughput subprocess: ``what`` (bare | trainer) of ``model`` in ``variant`` at each of ``batches``."""

    model: str
    what: str
    variant: str
    batches: tuple[int, ...]
    tiny: bool = False
    warmup: int = 5
    steps: int = 20
    cache_items: int = 0  # 0: two batches of the largest size


def job_micro_batches(job: Job) -> int:
    """Micro-batches per timed step: one trainer step is an optimizer update over all of them."""
    return 2 if job.what == "trainer" and job.variant == "accumulation" else 1


def job_config(job: Job, config_dir: Path, assets: Assets, cache_dir: Path, items: int) -> TrainConfig:
    """The recipe's config, quiet, trained from a cache of ``items``: on disk at ``cache_dir``, or in memory."""
    disk_cache = [f"data.path={assets.images}", f"data.cache_dir={cache_dir}"]
    in_memory = "data.cache_latents=true" in RECIPES[job.model]
    return compose_train_config(
        config_dir, [*quiet_recipe(job, assets), *([f"data.length={items}"] if in_memory else disk_cache)]
    )


def quiet_recipe(job: Job, assets: Assets) -> list[str]:
    """The overrides of ``job``'s recipe and variant, on the check's tiny models, quiet (no logging, sampling,
    checkpoints or validation)."""
    overrides = [
        *RECIPES[job.model],
        f"vae.pretrained={assets.vae8}",
        f"conditioner.pretrained={assets.t5}",
        "logger=none",
        "validation.every_n_steps=0",
        "monitor.reward.enabled=false",
        "trainer.sample_every=0",
        "trainer.checkpoint_every=0",
        f"trainer.max_steps={10**9}",
        f"trainer.log_every={10**9}",
        *(TINY if job.tiny else []),
        *([] if torch.cuda.is_available() else ["trainer.mixed_precision=no"]),  # bf16 is 1.3-1.5x slower on a CPU
    ]
    if job.what != "bare" or job.variant == "checkpointing":  # the bare step compiles its blocks itself
        overrides += VARIANT_OVERRIDES[job.variant]
    return overrides


def write_synthetic_cache(cfg: TrainConfig, items: int, width: int, seed: int = 0) -> None:
    """A disk cache for ``cfg`` of ``items`` random posteriors and ``width``-wide text embeddings, with the prompts
    the run asks for; an existing one is kept."""
    cache_dir = Path(str(cfg.data.cache_dir))
    if (cache_dir / INDEX).is_file():
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    latent = cfg.data.resolution // 8  # the stand-in VAE's downsampling
    plan = plan_run(cfg, method_of(cfg.trainer), 1)
    tokens, prompts = cfg.conditioner.max_length, plan.sampled_prompts
    condition, prompt_condition = (
        Condition(torch.randn(n, tokens, width, generator=generator), torch.ones(n, tokens, dtype=torch.long))
        for n in (items, len(prompts))
    )
    tensors = {
        "latent_mean": torch.randn(items, 4, latent, latent, generator=generator),
        "latent_std": torch.full((items, 4, latent, latent), 0.05),
        **condition.stored("text_"),
    }
    storage = getattr(torch, cfg.data.cache_dtype)
    save_shard(cache_dir / shard_name(0, 0), tensors, [str(i) for i in range(items)], list(range(items)), storage)
    save_file({k: v.contiguous() for k, v in prompt_condition.stored().items()}, cache_dir / PROMPTS)
    index = {
        "fingerprint": cache_fingerprint(cfg.data, cfg.vae, cfg.conditioner, plan.buckets),
        "items": items,
        "dtype": cfg.data.cache_dtype,
        "shards": [{"file": shard_name(0, 0), "items": items}],
        "prompts": prompts,
        "bad_files": [],
    }
    (cache_dir / INDEX).write_text(json.dumps(index), encoding="utf-8")


def synthetic_inputs(parts, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, Condition]:
    """(x_t, t, condition) of ``batch`` images: random latents and timesteps, and the condition of "" (a cached
    embedding, or the null class), as many as the step feeds the DiT."""
    generator = torch.Generator(device).manual_seed(0)
    x_t = torch.randn((batch, *parts.latent_shape), generator=generator, device=device)
    t = torch.randint(0, parts.schedule.num_train_timesteps, (batch,), generator=generator, device=device)
    return x_t, t, parts.text_encoder.encode([""] * batch).to(device).cast(torch.float32)


def sdpa_kernels(forward) -> list[str]:
    """The attention kernels PyTorch's SDPA dispatched to in one call of ``forward`` (flash_attention,
    efficient_attention, cudnn_attention, attention_math; ``_for_cpu`` on the CPU), read from the profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        forward()
    names = {event.key for event in profile.key_averages() if event.key.startswith("aten::_scaled_dot_product_")}
    return sorted(name.removeprefix("aten::_scaled_dot_product_") for name in names)


def rank() -> int:
    """This process's rank under ``accelerate launch`` (0 alone): only rank 0 writes the cache and the result."""
    return int(os.environ.get("RANK", "0"))


def _device() -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def _wait_for(path: Path, timeout: float = 900) -> None:
    """Until rank 0 has written ``path`` (at once when it exists)."""
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was not written within {timeout:.0f} s")
        time.sleep(0.5)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _timed(step, job: Job, device: torch.device, batch: int) -> dict:
    """The step's median speed after ``job.warmup`` calls (the first call's time kept: it holds any compilation),
    and the peak memory since the last reset."""
    start = time.perf_counter()
    step()
    _synchronize(device)
    first = time.perf_counter() - start
    seconds = time_steps({"step": step}, max(0, job.warmup - 1), job.steps, device, rounds=1)["step"]
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    # every process of a launch steps alike; a step of the trainer is one update, over its micro-batches
    images = batch * job_micro_batches(job) * int(os.environ.get("WORLD_SIZE", "1"))
    return {"batch": batch, "status": "ok", "img_s": images / seconds, "seconds_per_step": seconds,
            "first_step_seconds": first, "peak_memory_mb": peak}  # fmt: skip


def _bare_step(cfg: TrainConfig, dit: DiTAdapter, optimizer, inputs) -> Callable[[], None]:
    """Forward, backward and the trainer's fused AdamW on one fixed batch: the limit the trainer is judged by."""
    x_t, t, condition = inputs
    dtype = weight_dtype(resolve_mixed_precision(cfg.trainer.mixed_precision))

    def step() -> None:
        with torch.autocast(x_t.device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = dit(x_t, t, condition).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _forward(cfg: TrainConfig, dit: DiTAdapter, inputs) -> Callable[[], None]:
    dtype = weight_dtype(resolve_mixed_precision(cfg.trainer.mixed_precision))

    def forward() -> None:
        with torch.no_grad(), torch.autocast(inputs[0].device.type, dtype=dtype, enabled=dtype != torch.float32):
            dit(*inputs)

    return forward


def _bare_steps(job: Job, cfg: TrainConfig, parts, device, work: Path) -> tuple[list[str], StepMaker]:
    """The bare step's kernels, and its step at a batch size: one model and optimizer for the whole sweep."""
    dit = parts.dit.to(device).train()
    kernels = sdpa_kernels(_forward(cfg, dit, synthetic_inputs(parts, 2, device)))
    if job.variant == "compile":
        compile_blocks(dit)
    optimizer = build_optimizer(cfg.optim, dit)
    return kernels, lambda batch, _trainers: _bare_step(cfg, dit, optimizer, synthetic_inputs(parts, batch, device))


def _trainer_steps(job: Job, cfg: TrainConfig, parts, device, work: Path) -> tuple[list[str], StepMaker]:
    """The kernels of the recipe's DiT, and the trainer's step at a batch size: a trainer built by ``train.py``'s
    own code for each batch size, in a run folder of its own (its lock given back when the batch size's row ends)."""
    kernels = sdpa_kernels(_forward(cfg, parts.dit.to(device), synthetic_inputs(parts, 2, device)))
    parts.dit.to("cpu")

    def make(batch: int, trainers: ExitStack) -> Callable[[], object]:
        sized = replace(cfg, trainer=replace(cfg.trainer, batch_size=batch))
        trainer = trainers.enter_context(build_trainer(sized, work / f"run-{job.model}-{job.variant}-{batch}"))
        batches = trainer.step.batches()
        return lambda: trainer.step(batches)

    return kernels, make


def _online_job(job: Job, config_dir: Path, assets: Assets, work: Path) -> Prepared:
    """An online row: its precision, no FLOP count (an epoch's FLOPs per image are the sampler's and the update's),
    no kernel probe, and its epochs."""
    name = f"{job.model}{'-tiny' if job.tiny else ''}"
    precision, make = online_steps(quiet_recipe(job, assets), assets, job.what, config_dir, work, name)
    return precision, None, [], make


def _throughput_job(job: Job, config_dir: Path, assets: Assets, work: Path) -> Prepared:
    """A bare or trainer row's precision, the DiT's training FLOPs per image, the SDPA kernels and its steps."""
    device = _device()
    items = job.cache_items or 2 * max(job.batches)
    cfg = job_config(job, config_dir, assets, work / f"cache-{job.model}-{items}{'-tiny' if job.tiny else ''}", items)
    cached_text = None
    if cfg.data.cache_dir:
        if rank() == 0:
            write_synthetic_cache(cfg, items, TINY_WIDTH if job.tiny else T5_XXL_WIDTH)
        _wait_for(Path(str(cfg.data.cache_dir)) / INDEX)
        cached_text = open_run_cache(cfg, plan_run(cfg, method_of(cfg.trainer), 1), device)[1]
    dtype = weight_dtype(resolve_mixed_precision(cfg.trainer.mixed_precision))
    parts = call_with_sections(build_components, cfg, device=device, frozen_dtype=dtype, cached_text=cached_text)
    with torch.device("meta"):  # the model's own FLOPs: recomputation by checkpointing is not counted
        meta_dit = build_dit(cfg.model, parts.latent_shape[0], parts.latent_shape[-1], parts.text_encoder.size)
    train_flops = count_flops(meta_dit, *synthetic_inputs(parts, 2, device))[1]
    kernels, make = (_bare_steps if job.what == "bare" else _trainer_steps)(job, cfg, parts, device, work)
    return cfg.trainer.mixed_precision, train_flops, kernels, make


def run_job(job: Job, config_dir: Path, assets: Assets, work: Path) -> dict:
    """Measure ``job``: what its result file holds (per batch: img/s, seconds per step, peak memory; or "oom")."""
    prepare = _online_job if job.what in ONLINE_METHODS else _throughput_job
    precision, train_flops, kernels, make = prepare(job, config_dir, assets, work)
    device = _device()
    results, oom = [], None
    for batch in sorted(job.batches):
        if oom is not None:
            results.append({"batch": batch, "status": "skipped", "error": f"batch {oom} did not fit"})
            continue
        _free(device)
        step = None
        try:
            with ExitStack() as trainers:
                step = make(batch, trainers)
                results.append(_timed(step, job, device, batch))
        except torch.OutOfMemoryError as error:
            oom = batch
            results.append({"batch": batch, "status": "oom", "error": str(error).splitlines()[0]})
        except ConfigError as error:
            if error.key != "trainer.batch_size":  # not the memory check's verdict: the row failed
                raise
            oom = batch  # the memory check refused it: the smaller batches' rows stand
            results.append({"batch": batch, "status": "refused", "error": str(error)})
        finally:
            step = None
    return {
        "status": "ok",
        "job": asdict(job),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "mixed_precision": precision,
        "processes": int(os.environ.get("WORLD_SIZE", "1")),
        "train_flops_per_image": train_flops,
        "sdpa_kernels": kernels,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "batches": results,
    }


def run_jobs(jobs: list[Job], config_dir: Path, assets: Assets, work: Path) -> list[dict]:
    """Each job's result; one that raises is recorded as failed, with the tail of its traceback, and the next runs."""
    results = []
    for job in jobs:
        try:
            results.append(run_job(job, config_dir, assets, work))
        except Exception:  # noqa: BLE001 (recorded: the other jobs still run)
            results.append({"status": "failed", "error": traceback.format_exc()[-3000:]})
    return results
