"""How fast the trainer is against what the model allows: four measurements in one process, same model and data.

(a) ``bare``: the DiT's forward + backward + AdamW step on one fixed batch of latents and embeddings, the limit;
(b) ``trainer_cached``: the trainer's own step (``Trainer.step``) reading the precomputed cache;
(c) ``trainer_uncached``: the same step encoding every batch with the frozen VAE and text encoder;
(d) ``reference``: a straightforward loop in the style of diffusers' training examples (fp32, encode every step,
    tokenize every step, no cache, the default AdamW);
(e) ``trainer_private``, with ``privacy.enabled=true``: the trainer's DP-SGD step from the cache (Opacus clipping
    and noise, Poisson batches of the same expected size), timed alongside (a) and (b) for the cost of DP.

Each is timed per step after a warm-up and reported as the median, in images/s and as a ratio to (a); (a) and (b)
are timed in alternating blocks so their ratio (the trainer's overhead) survives a noisy machine. FLOPs per image
come from ``torch.utils.flop_counter`` on the meta device (attention counted, whatever the family) so that MFU can
be worked out for any GPU. With ``--loader``, ``run_loader_benchmark`` sets the training loader's images/s at each
worker count (``loader_benchmark``) against (c)'s.
"""

from __future__ import annotations

import copy
import json
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler
from torch.utils.data import DataLoader, Dataset

from dit_trainer.apps.loader_benchmark import loader_images_per_second
from dit_trainer.apps.precompute import precompute
from dit_trainer.assemble import build_trainer, open_run_cache, plan_run
from dit_trainer.components.build import Components, build_components
from dit_trainer.components.geometry import configured_buckets
from dit_trainer.components.meta import count_flops
from dit_trainer.condition import Condition
from dit_trainer.config import TrainConfig, call_with_sections
from dit_trainer.data.batch_plan import BatchPlan, PlanBatchSampler
from dit_trainer.data.collate import collate_batch
from dit_trainer.data.sources.source import build_dataset
from dit_trainer.errors import ConfigError
from dit_trainer.methods import method_of
from dit_trainer.pixels import to_model_range
from dit_trainer.precision import resolve_mixed_precision, weight_dtype
from dit_trainer.training.optim import build_optimizer


@dataclass
class Measurement:
    name: str
    seconds_per_step: float  # median over the timed steps
    images_per_sec: float
    peak_memory_mb: float | None  # CUDA: peak allocated during this measurement; None on CPU (see peak_rss_mb)


def time_steps(steps: dict[str, Callable[[], object]], warmup: int, count: int, device, rounds: int) -> dict:
    """Median seconds per call of each step function, after ``warmup`` calls each. The timed calls alternate
    between the functions in ``rounds`` blocks, so that a machine slowing down or speeding up mid-run (shared
    hosts do) shifts all of them alike and their ratio stays right."""
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            for _ in range(max(1, count // rounds)):
                synchronize()
                start = time.perf_counter()
                step()
                synchronize()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def measure(
    steps: dict[str, Callable[[], object]], batch_size: int, warmup: int, count: int, device, rounds: int = 1
) -> list[Measurement]:
    """``steps`` timed together (see ``time_steps``); on CUDA the peak memory is that of all of them together."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = time_steps(steps, warmup, count, device, rounds)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return [Measurement(name, seconds[name], batch_size / seconds[name], peak) for name in steps]


def fixed_batch(
    cfg: TrainConfig, parts: Components, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, Condition]:
    """What one training step feeds the DiT, made once from the first batch of the real data (real captions:
    their token masks change the attention's cost): noisy latents, timesteps and the captions' condition."""
    generator = torch.Generator(device).manual_seed(0)
    loader = DataLoader(build_dataset(cfg.data), batch_size=cfg.trainer.batch_size, collate_fn=collate_batch)
    batch = next(iter(loader))
    latents = parts.vae.encode(to_model_range(batch["image"].to(device)), generator)
    condition = parts.text_encoder.encode(batch["caption"])
    t = parts.schedule.at_size(latents.shape).sample_timesteps(len(latents), device, generator)
    x_t = parts.schedule.add_noise(latents, torch.randn(latents.shape, generator=generator, device=device), t)
    return x_t, t, condition


def bare_step(cfg: TrainConfig, parts: Components, device: torch.device) -> Callable[[], None]:
    """(a): forward, backward and the trainer's own (fused) AdamW, nothing else."""
    dit = copy.deepcopy(parts.dit).to(device).train()
    optimizer = build_optimizer(cfg.optim, dit)
    x_t, t, condition = fixed_batch(cfg, parts, device)
    dtype = weight_dtype(resolve_mixed_precision(cfg.trainer.mixed_precision))

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = F.mse_loss(dit(x_t, t, condition).float(), x_t)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def trainer_step(cfg: TrainConfig, run_dir: Path, trainers: ExitStack) -> Callable[[], None]:
    """(b) and (c): ``Trainer.step`` of the real trainer built by ``train.py``'s own code, closed (its run folder's
    lock given back) with ``trainers``."""
    trainer = trainers.enter_context(build_trainer(cfg, run_dir))
    batches = trainer.step.batches()
    return lambda: trainer.step(batches)


def _endless(loader: DataLoader) -> Iterator[dict]:
    while True:
        yield from loader


def reference_step(cfg: TrainConfig, parts: Components, device: torch.device) -> Callable[[], None]:
    """(d): the loop of diffusers' ``train_text_to_image.py``, reduced to what our step also does (the VAE's and the
    family's calls, so that every family and VAE kind has its reference: 5-D video VAEs, packed or batch-normalised
    latents, pixel space)."""
    vae, text, family = parts.vae, parts.text_encoder, parts.dit.family
    generator = torch.Generator(device).manual_seed(0)
    transformer = copy.deepcopy(parts.dit.transformer).to(device).train()
    optimizer = torch.optim.AdamW(transformer.parameters(), lr=cfg.optim.lr)
    scheduler = DDPMScheduler(num_train_timesteps=cfg.diffusion.num_train_timesteps)
    loader = DataLoader(
        build_dataset(cfg.data),
        batch_size=cfg.trainer.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=cfg.data.num_workers,
        collate_fn=collate_batch,
    )
    batches = _endless(loader)

    def step() -> None:
        batch = next(batches)
        with torch.no_grad():
            images = to_model_range(batch["image"].to(device))
            latents = vae.encode(images, generator)  # sampled from the posterior, scaled
            condition = text.encode_uncached(batch["caption"])  # tokenized and encoded every step
        noise = torch.randn_like(latents)
        t = torch.randint(0, scheduler.config.num_train_timesteps, (latents.shape[0],), device=device)
        noisy = scheduler.add_noise(latents, noise, t)
        prediction = family.predict(transformer, noisy, t, condition)
        loss = F.mse_loss(prediction.float(), noise.float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), cfg.optim.max_grad_norm or float("inf"))
        optimizer.step()
        optimizer.zero_grad()

    return step


def batch_plan_cost(cache: Dataset, batch_size: int, epochs: int = 3) -> dict[str, float]:
    """Seconds per batch of reading ``cache`` through a shuffled loader and through the batch plan that buckets and
    mixtures use (three buckets and two sources weighted 3:1 laid over the same items, so the plan does all its
    work, and the items read are the same kind): their difference is what buckets and mixtures add to a step."""
    labels = [index % 3 for index in range(len(cache))]
    plan = BatchPlan(labels, batch_size, seed=0, sources=[index % 2 for index in range(len(cache))], weights=[3, 1])
    loaders = {
        "shuffled": DataLoader(cache, batch_size, shuffle=True, drop_last=True, collate_fn=collate_batch),
        "planned": DataLoader(cache, batch_sampler=PlanBatchSampler(plan), collate_fn=collate_batch),
    }
    seconds = {}
    for name, loader in loaders.items():
        start, batches = time.perf_counter(), 0
        for epoch in range(epochs):
            plan.set_epoch(epoch)
            batches += sum(1 for _ in loader)
        seconds[name] = (time.perf_counter() - start) / batches
    return seconds


def flops_per_image(cfg: TrainConfig, parts: Components, device: torch.device) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs of the run's DiT per image, on the first batch of its data."""
    return count_flops(parts.dit, *fixed_batch(cfg, parts, device))


def run_benchmark(cfg: TrainConfig, out_dir: Path, warmup: int = 5, steps: int = 20) -> dict:
    """All four measurements of a validated ``cfg``; writes ``out_dir/benchmark.json`` (and the cache in
    ``out_dir/cache`` unless ``data.cache_dir`` names one) and returns what it wrote."""
    check_out_dir(out_dir, "benchmark.json")
    private = cfg.privacy.enabled
    cfg = replace(cfg, privacy=replace(cfg.privacy, enabled=False))  # (a)-(d) measure the non-private trainer
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    quiet = replace(cfg.trainer, sample_every=0, log_every=10**9, checkpoint_every=0, resume=None, max_steps=10**9)
    cfg = replace(cfg, trainer=quiet, monitor=replace(cfg.monitor, reward=replace(cfg.monitor.reward, enabled=False)))
    cached = replace(cfg, data=replace(cfg.data, cache_dir=cfg.data.cache_dir or str(out_dir / "cache")))
    start = time.perf_counter()
    call_with_sections(precompute, cached)
    precompute_seconds = time.perf_counter() - start
    uncached = replace(cfg, data=replace(cfg.data, cache_dir=None, cache_latents=False))

    torch.manual_seed(cfg.trainer.seed)
    parts = call_with_sections(build_components, cfg, device=device, frozen_dtype=torch.float32)
    batch = cfg.trainer.batch_size
    with ExitStack() as trainers:
        # (a) and (b) are timed interleaved: their ratio is the framework overhead, the number that needs precision.
        interleaved = {
            "bare": bare_step(cfg, parts, device),
            "trainer_cached": trainer_step(cached, out_dir / "trainer_cached", trainers),
        }
        if private:  # the noise level does not change the cost: a fixed one spares calibrating for max_steps=10**9
            dp = replace(
                cfg.privacy, enabled=True, noise_multiplier=cfg.privacy.noise_multiplier or 1.0, target_epsilon=None
            )
            private_run = replace(cached, privacy=dp)
            interleaved["trainer_private"] = trainer_step(private_run, out_dir / "trainer_private", trainers)
        results = measure(interleaved, batch, warmup, steps, device, rounds=4)
        uncached_step = trainer_step(uncached, out_dir / "trainer_uncached", trainers)
        results += measure({"trainer_uncached": uncached_step}, batch, warmup, steps, device)
    results += measure({"reference": reference_step(cfg, parts, device)}, batch, warmup, steps, device)
    forward_flops, train_flops = flops_per_image(cfg, parts, device)
    speed = {m.name: m.images_per_sec for m in results}
    bare = speed["bare"]
    reading = batch_plan_cost(open_run_cache(cached, plan_run(cached, method_of(cached.trainer), 1), device)[0], batch)
    private_cost = {"private_cost_ratio": speed["trainer_cached"] / speed["trainer_private"]} if private else {}
    report = {
        **{f"{m.name}_img_s" if m.name != "bare" else "bare_step_img_s": m.images_per_sec for m in results},
        **{f"{m.name}_ratio_to_bare": m.images_per_sec / bare for m in results},
        "cached_speedup_over_reference": speed["trainer_cached"] / speed["reference"],
        **private_cost,  # seconds per DP step / seconds per non-DP step
        # what the batch plan of buckets and mixtures adds to reading a batch, as a fraction of a cached step
        "batch_plan_seconds_per_batch": reading["planned"],
        "shuffled_seconds_per_batch": reading["shuffled"],
        "batch_plan_cost_of_cached_step": (reading["planned"] - reading["shuffled"]) * speed["trainer_cached"] / batch,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_cuda_mb": {m.name: m.peak_memory_mb for m in results},
        "forward_flops_per_image": forward_flops,
        "train_flops_per_image": train_flops,
        "precompute_seconds": precompute_seconds,
        "batch_size": batch,
        "timed_steps": steps,
        "warmup_steps": warmup,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    (out_dir / "benchmark.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def check_out_dir(out_dir: Path, report: str) -> None:
    """The benchmark's folder (``--out``), before anything is measured: not a file, and without an earlier
    ``report``, which a benchmark never overwrites."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError("--out", str(out_dir), "it is a file, and the benchmark writes a folder", "pass a folder")
    if (out_dir / report).exists():
        raise ConfigError(
            "--out",
            str(out_dir),
            f"it holds the {report} of an earlier benchmark, which a benchmark never overwrites",
            "pass another `--out`, or leave it out (a new folder named by the date and time)",
        )


def format_table(report: dict) -> str:
    """The four measurements as a table (images/s, ratio to the bare step, peak CUDA memory) and the FLOPs."""
    rows = [
        ("(a) bare DiT step", "bare_step", "bare"),
        ("(b) trainer, cache", "trainer_cached", "trainer_cached"),
        ("(c) trainer, encode every batch", "trainer_uncached", "trainer_uncached"),
        ("(d) reference loop (diffusers style)", "reference", "reference"),
        ("(e) trainer, cache, DP-SGD", "trainer_private", "trainer_private"),
    ]
    lines = [f"{'measurement':<38}{'img/s':>10}{'x (a)':>8}{'peak CUDA MB':>14}"]
    for label, key, name in (row for row in rows if f"{row[2]}_ratio_to_bare" in report):
        ratio = report[f"{name}_ratio_to_bare"]
        peak = report["peak_cuda_mb"][name]
        lines.append(
            f"{label:<38}{report[f'{key}_img_s']:>10.1f}{ratio:>8.2f}{'-' if peak is None else f'{peak:.0f}':>14}"
        )
    lines += [
        f"cache vs reference: {report['cached_speedup_over_reference']:.2f}x; peak RSS {report['peak_rss_mb']:.0f} MB; "
        f"precompute {report['precompute_seconds']:.1f} s"
        + (
            f"; DP step cost {report['private_cost_ratio']:.2f}x the non-DP step"
            if "private_cost_ratio" in report
            else ""
        ),
        f"buckets and mixtures (the batch plan): {report['batch_plan_cost_of_cached_step']:+.2%} of a cached step",
        f"DiT FLOPs per image: forward {report['forward_flops_per_image']:.3g}, training "
        f"{report['train_flops_per_image']:.3g} (MFU = img/s x training FLOPs / peak FLOP/s)",
    ]
    return "\n".join(lines)


def run_loader_benchmark(cfg: TrainConfig, out_dir: Path, workers: list[int], batches: int, steps: int) -> dict:
    """The loader's images/s at each worker count (``loader_benchmark``) and the trainer's (uncached) step's; writes
    ``out_dir/loader.json`` and returns it."""
    check_out_dir(out_dir, "loader.json")
    out_dir.mkdir(parents=True, exist_ok=True)
    buckets = configured_buckets(cfg.model, cfg.vae, cfg.data)
    loader = {str(count): loader_images_per_second(cfg.data, cfg.trainer, buckets, count, batches) for count in workers}
    quiet = replace(cfg.trainer, sample_every=0, log_every=10**9, checkpoint_every=0, resume=None, max_steps=10**9)
    data = replace(cfg.data, cache_dir=None, cache_latents=False)
    uncached = replace(
        cfg, trainer=quiet, data=data, monitor=replace(cfg.monitor, reward=replace(cfg.monitor.reward, enabled=False))
    )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with ExitStack() as trainers:
        trainer = trainer_step(uncached, out_dir / "trainer", trainers)
        step = measure({"trainer": trainer}, cfg.trainer.batch_size, 2, steps, device)
    report = {
        "loader_img_s_by_workers": loader,
        "trainer_uncached_img_s": step[0].images_per_sec,
        "batch_size": cfg.trainer.batch_size,
        "resolution": cfg.data.resolution,
        "prefetch_factor": cfg.data.prefetch_factor,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    (out_dir / "loader.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


def format_loader_table(report: dict) -> str:
    lines = [f"{'data.num_workers':<18}{'loader img/s':>14}{'x trainer step':>16}"]
    trainer = report["trainer_uncached_img_s"]
    for workers, speed in report["loader_img_s_by_workers"].items():
        lines.append(f"{workers:<18}{speed:>14.1f}{speed / trainer:>16.1f}")
    lines.append(f"trainer step (encoding every batch, {report['device']}): {trainer:.1f} img/s")
    return "\n".join(lines)
