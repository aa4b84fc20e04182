"""``precision.fp8``: the DiT's block linear layers trained in FP8 through torchao's float8 training
(``convert_to_float8_training``), as torchtitan does: each ``nn.Linear`` becomes a ``Float8Linear`` that keeps its
float32 weight (the state-dict keys and the checkpoints are unchanged) and casts input, weight and output gradient
to FP8 with dynamic scales for its three matmuls. Only the blocks are converted, where the FLOPs are; the embeddings
(a family's ``shared`` embedder too, though it sits in block 0) and the final layer, which are small and sensitive,
stay in autocast's precision. The conversion happens before
``trainer.compile`` (its casts then fuse into the compiled blocks) and before ``accelerate.prepare``."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from dit_trainer.components.dit import DiTAdapter
from dit_trainer.config import LoRAConfig, PrecisionConfig, PrivacyConfig
from dit_trainer.errors import ConfigError, require

logger = logging.getLogger(__name__)
FP8_CAPABILITY = (8, 9)  # Ada (L4, L40S, RTX 4090), Hopper (H100, H200), Blackwell (B200)
FP8_ALIGNMENT = 16  # FP8 GEMMs need both sizes of the weight to be multiples of 16


def fp8_unsupported(device: torch.device) -> str:
    """Why ``device`` cannot run FP8 matmuls ('' when it can)."""
    if device.type != "cuda":
        return f"this run's device is {device.type}, which has no FP8 matmuls"
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return f"this run's GPU ({name}) has compute capability {capability[0]}.{capability[1]}"
    return ""


def _expected_device() -> torch.device:
    """The device a run launched here trains on (before accelerate picks it): the first GPU, else the CPU."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def check_fp8(lora: LoRAConfig, privacy: PrivacyConfig, precision: PrecisionConfig) -> None:
    """Refuse ``precision.fp8`` where it cannot train, before any model loads."""
    p = precision
    require(not p.fp8_emulate or p.fp8, "precision.fp8_emulate", p.fp8_emulate,
            "it emulates FP8 training, and `precision.fp8` is false", "set `precision.fp8=true` too")  # fmt: skip
    if not p.fp8:
        return
    require(importlib.util.find_spec("torchao") is not None, "precision.fp8", True,
            "FP8 training runs through torchao, which is not installed",
            "`pip install torchao --no-deps` (which keeps your torch), or set `precision.fp8=false`")  # fmt: skip
    require(not lora.enabled, "precision.fp8", True,
            "it trains the blocks' linear layers in FP8, and under `lora.enabled=true` those are frozen (only the "
            "adapters train)", "set `precision.fp8=false` for LoRA runs")  # fmt: skip
    require(not privacy.enabled, "precision.fp8", True,
            "Opacus computes per-sample gradients of nn.Linear layers from their own hooks, which FP8's matmuls "
            "bypass", "set `precision.fp8=false` for DP runs")  # fmt: skip
    if not p.fp8_emulate:
        _require_fp8_device(_expected_device())


def _require_fp8_device(device: torch.device) -> None:
    why = fp8_unsupported(device)
    if why:
        raise ConfigError(
            "precision.fp8",
            True,
            f"FP8 matmuls need an NVIDIA GPU of compute capability {FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]} or newer "
            f"(L4, L40S, RTX 4090, H100, H200, B200) and {why}",
            "set `precision.fp8=false`, or `precision.fp8_emulate=true` to check FP8's numerics slowly on any device",
        )


def _is_block_linear(blocks: set[int]) -> Callable[[nn.Module, str], bool]:
    def convert(module: nn.Module, name: str) -> bool:
        sizes = (module.in_features, module.out_features) if isinstance(module, nn.Linear) else ()
        return bool(sizes) and id(module) in blocks and all(size % FP8_ALIGNMENT == 0 for size in sizes)

    return convert


def apply_fp8(precision: PrecisionConfig, dit: DiTAdapter, device: torch.device) -> int:
    """Convert the linear layers of ``dit``'s blocks to FP8 training in place (``precision.fp8``); returns how many."""
    if not precision.fp8:
        return 0
    if not precision.fp8_emulate:
        _require_fp8_device(device)  # the device accelerate chose (e.g. a CPU launch on a GPU machine)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    # pad_inner_dim: a weight gradient's inner size is the rows of the input (the batch, for a per-image linear
    # layer; the tokens of a caption), and FP8's matmul needs a multiple of 16 there
    recipe = Float8LinearConfig.from_recipe_name(precision.fp8_recipe)
    config = replace(recipe, emulate=precision.fp8_emulate, pad_inner_dim=True)
    shared = {id(module) for path in dit.family.shared for module in dit.transformer.get_submodule(path).modules()}
    linears = {id(module) for block in dit.blocks() for module in block.modules()
               if isinstance(module, nn.Linear) and id(module) not in shared}  # fmt: skip
    convert = _is_block_linear(linears)
    count = sum(convert(module, name) for name, module in dit.transformer.named_modules())
    if not count:  # the run would train exactly as without FP8, under a config that says FP8
        widths = sorted({(m.in_features, m.out_features) for m in dit.transformer.modules() if id(m) in linears})
        raise ConfigError(
            "precision.fp8",
            True,
            f"none of the DiT's {len(linears)} block linear layers can run in FP8: FP8 matmuls need both sizes of a "
            f"weight to be multiples of {FP8_ALIGNMENT}, and theirs are {', '.join(f'{i}x{o}' for i, o in widths[:6])}",
            "set `precision.fp8=false` (a model this small gains nothing from FP8), or widen the model",
        )
    convert_to_float8_training(dit.transformer, config=config, module_filter_fn=convert)
    others = len(linears) - count
    skipped = f" (the other {others}: sizes not multiples of {FP8_ALIGNMENT})" if others else ""
    logger.info(f"FP8 training: {count} of the DiT's {len(linears)} block linear layers{skipped}")
    return count
