"""Every family (``dit_trainer.components.families.FAMILIES``) trains sharded: FSDP2 on 2 CPU processes gives the
losses, gradient norms and whole weights of DDP, and a family whose blocks share a module (the DiT's embedder)
resumes exactly and keeps every block's keys in its whole weights. DiT-XL/2 (``experiment=dit_imagenet``) builds
and shards on the meta device with the units the trainer gives it. PixArt's sharded runs: ``test_fsdp.py``.

Run as ``python -m tests.e2e.test_fsdp_families`` under an FSDP launch, this module is the meta-device check's
script (``shard_dit_xl_on_meta``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dit_trainer.components.families import FAMILIES
from dit_trainer.data.sources.digits import write_digits_folder

from ..conftest import (
    CONFIG_DIR,
    CPU_PROCESSES,
    TINY_SHAPES,
    accelerate_launch,
    class_conditional,
    read_metrics,
    run_script,
)
from ..tiny_flux import flux_overrides, write_tiny_flux
from ..tiny_flux2 import flux2_overrides, write_tiny_flux2
from ..tiny_qwen_image import qwen_image_overrides, write_tiny_qwen_image
from ..tiny_sana import sana_overrides, write_sana_folder
from ..tiny_sd3 import overrides as sd3_overrides
from ..tiny_sd3 import write_tiny_sd3
from ..tiny_wan import wan_overrides, write_tiny_wan
from ..tiny_z_image import write_tiny_z_image, z_image_overrides
from .runs_in_turn import ended, launch_in_turn
from .test_fsdp import FSDP_TOLERANCE, WEIGHTS, fsdp_launch, losses

# Each family's tiny run (overrides after TINY_SHAPES), from a scratch folder its files may be written to. A family
# registered without one fails its test below: add its run here.
TINY_RUNS: dict[str, Callable[[Path], list[str]]] = {
    "dit": lambda folder: class_conditional(write_digits_folder(folder / "digits", resolution=16)),
    "sd3": lambda folder: sd3_overrides(write_tiny_sd3(folder)),
    "flux": lambda folder: flux_overrides(write_tiny_flux(folder)),
    "sana": lambda folder: sana_overrides(write_sana_folder(folder)),
    "z_image": lambda folder: z_image_overrides(write_tiny_z_image(folder)),
    "qwen_image": lambda folder: qwen_image_overrides(write_tiny_qwen_image(folder)),
    "flux2": lambda folder: flux2_overrides(write_tiny_flux2(folder)),
    "wan": lambda folder: wan_overrides(write_tiny_wan(folder)),  # clips of a video folder
}
# Trained sharded elsewhere, against DDP too.
ELSEWHERE = {"pixart_alpha": "test_fsdp.py (TINY_SHAPES)", "pixart_sigma": "test_fsdp.py: pixart_alpha's class"}
# 3 steps, each logged; checkpoints at 2 (resumed from) and 3 (compared); no samples.
STEPS = ("trainer.max_steps=3", "trainer.log_every=1", "trainer.checkpoint_every=2", "trainer.sample_every=0")
DIT_XL_PARAMETERS = 674_834_720  # DiT-XL/2 with one shared embedder: the paper's (components/families/dit.py)


SHARDED_HERE = [name for name in FAMILIES if name not in ELSEWHERE]


def whole_weights(run_dir: Path, step: int, weights: str) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"checkpoint-{step}" / weights / WEIGHTS)


def grad_norms(run_dir: Path) -> dict[int, float]:
    return {record["step"]: record["grad_norm"] for record in read_metrics(run_dir)}


@pytest.fixture(scope="module")
def family_runs(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """Every family's tiny run under FSDP and under DDP, in two launches (``runs_in_turn``: a launch per run spent
    most of its time starting), and a family with shared modules resumed sharded from its checkpoint-2. Returns the
    folder the runs are in (``fsdp/FAMILY``, ``ddp/FAMILY``, ``fsdp/FAMILY-resumed``) and each launch's output."""
    root = tmp_path_factory.mktemp("families")
    plans: dict[str, dict[str, list[str]]] = {"fsdp": {}, "ddp": {}}
    for family in (name for name in SHARDED_HERE if name in TINY_RUNS):  # a family without one fails its test
        base = [*TINY_SHAPES, *TINY_RUNS[family](root / "models" / family), *STEPS]
        for how, plan in plans.items():
            plan[family] = [*base, f"hydra.run.dir={root / how / family}"]
        if FAMILIES.get(family).shared:
            resume = f"trainer.resume={root / 'fsdp' / family / 'checkpoints' / 'checkpoint-2'}"
            plans["fsdp"][f"{family}-resumed"] = [*base, f"hydra.run.dir={root / 'fsdp' / f'{family}-resumed'}", resume]
    launchers = {"fsdp": (fsdp_launch(), {"OMP_NUM_THREADS": "1"}), "ddp": (accelerate_launch(2), CPU_PROCESSES)}
    printed = {how: launch_in_turn(launcher, plans[how], root / f"{how}.json", env)
               for how, (launcher, env) in launchers.items()}  # fmt: skip
    return root, printed


@pytest.mark.slow
@pytest.mark.parametrize("family", SHARDED_HERE)
def test_each_family_trains_sharded_as_with_ddp(family, family_runs):
    assert family in TINY_RUNS, f"family {family!r} has no tiny run for the FSDP test: add it to TINY_RUNS"
    root, printed = family_runs
    for how in ("fsdp", "ddp"):
        ended(printed[how], family)
    sharded, replicated = root / "fsdp" / family, root / "ddp" / family
    assert sorted(losses(sharded)) == [1, 2, 3]
    for measured in (losses, grad_norms):  # the norm is clipping's, taken from the slices
        fsdp, ddp = measured(sharded), measured(replicated)
        assert max(abs(fsdp[s] - ddp[s]) for s in ddp) < FSDP_TOLERANCE, (measured.__name__, fsdp, ddp)
    for weights in ("transformer", "transformer_ema"):  # whole, gathered from the slices
        whole, reference = whole_weights(sharded, 3, weights), whole_weights(replicated, 3, weights)
        assert whole.keys() == reference.keys()
        assert max((whole[k] - reference[k]).abs().max().item() for k in whole) < 1e-4
    if FAMILIES.get(family).shared:
        ended(printed["fsdp"], f"{family}-resumed")
        check_shared_modules_resume(sharded, root / "fsdp" / f"{family}-resumed", FAMILIES.get(family).shared)


def check_shared_modules_resume(run_dir: Path, resumed: Path, shared: tuple[str, ...]) -> None:
    """A model whose blocks share modules (``shared``: their paths in block 0): its whole weights keep every block's
    keys, equal to block 0's (diffusers' layout), and the run ``resumed`` from the sharded checkpoint-2 trained step
    3 as the uninterrupted run did."""
    whole = whole_weights(run_dir, 3, "transformer")
    for path in shared:
        blocks, inside = path.split(".0.", 1)
        copies = {key: re.sub(rf"^{re.escape(blocks)}\.\d+\.", f"{blocks}.0.", key) for key in whole
                  if re.match(rf"{re.escape(blocks)}\.[1-9]\d*\.{re.escape(inside)}\.", key)}  # fmt: skip
        assert copies and all(torch.equal(whole[copy], whole[key]) for copy, key in copies.items()), path
    assert losses(resumed) == {3: losses(run_dir)[3]}
    for weights in ("transformer", "transformer_ema"):
        straight, again = whole_weights(run_dir, 3, weights), whole_weights(resumed, 3, weights)
        assert all(torch.equal(straight[k], again[k]) for k in straight)


@pytest.mark.slow
def test_dit_xl_builds_and_shards_on_the_meta_device():
    launched = [*fsdp_launch(), "-m", "tests.e2e.test_fsdp_families"]
    result = run_script(launched, timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert all(f"rank {rank}: DiT-XL/2 sharded" in result.stdout for rank in (0, 1)), result.stdout[-2000:]


def shard_dit_xl_on_meta() -> None:
    """On each process of an FSDP launch: ``experiment=dit_imagenet``'s transformer built on the meta device and
    given the trainer's wrap units (``training/parallel/fsdp.py``, then accelerate's ``fsdp2_prepare_model``, what
    ``Accelerator.prepare`` applies to the model); every parameter must be a slice of a DTensor on the 2-process
    mesh, and the shared embedder one unit, one parameter set."""
    from accelerate import Accelerator
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    from dit_trainer.components.dit import build_dit
    from dit_trainer.condition import ConditionSize
    from dit_trainer.config import ModelConfig
    from dit_trainer.training.parallel.fsdp import (
        check_fsdp,
        gather_shared_modules_once,
        launched_on_cpu_processes,
        shard_on_cpu_processes,
        wrap_family_blocks,
    )

    accelerator = Accelerator(cpu=launched_on_cpu_processes())
    shard_on_cpu_processes(accelerator)
    check_fsdp(accelerator)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        model = compose(config_name="train", overrides=["+experiment=dit_imagenet"]).model
    model = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), model))
    # ImageNet's 1,000 classes; the SD VAE's latents: 4 channels at 1/8 of the 256-px images.
    with torch.device("meta"):
        dit = build_dit(model, 4, 256 // 8, ConditionSize(1000))
    wrap_family_blocks(accelerator, dit)
    fsdp2_prepare_model(accelerator, dit)
    gather_shared_modules_once(dit)

    parameters = dict(dit.named_parameters())
    assert all(isinstance(p, DTensor) and p.device.type == "meta" for p in parameters.values())
    assert all(p.placements == (Shard(0),) and p.device_mesh.size() == 2 for p in parameters.values())
    assert sum(p.numel() for p in parameters.values()) == DIT_XL_PARAMETERS
    blocks, (embedder,) = dit.blocks(), dit.shared_modules()
    assert len(blocks) == 28 and all(block.norm1.emb is embedder for block in blocks)
    units = [module for module in dit.modules() if isinstance(module, FSDPModule)]
    assert len(units) == 28 + 2 and embedder in units and all(block in units for block in blocks)  # + the root

    def managed(unit: FSDPModule) -> set[int]:
        return {id(p.sharded_param) for group in unit._get_fsdp_state()._fsdp_param_groups for p in group.fsdp_params}

    shared = {id(p) for p in embedder.parameters()}
    assert managed(embedder) == shared and len(shared) == 5  # one set: the timestep MLP's 4 and the label table
    assert all(not managed(block) & shared for block in blocks)
    assert embedder._get_fsdp_state()._fsdp_param_groups[0].post_forward_mesh_info is None  # gathered once a step
    print(f"rank {accelerator.process_index}: DiT-XL/2 sharded: {len(parameters)} DTensor parameters in {len(units)} "
          f"units", flush=True)  # fmt: skip


if __name__ == "__main__":
    shard_dit_xl_on_meta()
