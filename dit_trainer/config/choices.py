"""Closed vocabularies: the values a setting can take that no user adds to (unlike families, sources or rewards,
whose names live in their registries). The implementations import them from here, so a setting's accepted values
and the code that acts on them cannot drift apart."""

from __future__ import annotations

from typing import Any

CROPS = ("center", "random", "none")  # data.crop
CACHE_DTYPES = ("float16", "bfloat16", "float32")  # data.cache_dtype: how precompute stores tensors
BUCKET_PRESETS = ("none", "pixart")  # data.buckets, besides a list of sizes
TIMESTEP_DENSITIES = ("uniform", "logit_normal", "mode", "cosmap")  # diffusion.timestep_sampling (SD3's)
FLOW_WEIGHTINGS = ("none", "sigma_sqrt", "cosmap")  # diffusion.flow_weighting
FID_FEATURES = ("inception", "vae")  # monitor.fid.features, evaluate.py's fid_features
PROMPT_SAMPLING = ("uniform", "spread")  # grpo.prompt_sampling
SDE_WINDOWS = ("fixed", "random", "sliding")  # grpo.sde_window: where the noisy, trained steps sit each epoch
SDE_TYPES = ("sde", "cps")  # grpo.sde_type: flow matching's stochastic step, Flow-GRPO's SDE or its CPS
# conditioner.pooling: no pooled vector | the mean over real tokens (a sentence embedding) | the model's pooler output
POOLINGS = ("none", "mean", "pooler")
# optim.name: fused AdamW (torch) | 8-bit AdamW (bitsandbytes) | Adafactor (torch) | Prodigy (prodigyopt)
OPTIMIZERS = ("adamw", "adamw8bit", "adafactor", "prodigy")
FP8_RECIPES = ("tensorwise", "rowwise")  # precision.fp8_recipe: torchao's float8 scaling, per tensor or per row
CLASS_LABELS = "class_labels"  # the conditioner.kind of class-conditional runs: prompts are class names or ids


def is_bucket_spec(value: Any) -> bool:
    """``none``, ``pixart`` or a non-empty list of [height, width] pairs of positive whole numbers."""
    if isinstance(value, str):
        return value in BUCKET_PRESETS
    try:
        pairs = [list(pair) for pair in value]
    except TypeError:
        return False
    return bool(pairs) and all(
        len(pair) == 2 and all(isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in pair)
        for pair in pairs
    )
