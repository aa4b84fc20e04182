"""What an online fine-tuning row of the GPU check measures: one epoch of ``trainer.method`` (GRPO or DiffusionNFT)
at the model's real size, rollouts, rewards and update together, as ``train.py`` builds it.

The policy is the recipe's DiT with random weights, written once with ``save_pretrained`` (the methods fine-tune a
trained model: they take ``model.pretrained``), conditioned on the check's tiny T5 and decoded by its tiny VAE, and
the reward is the check's tiny CLIP: the row times the DiT's work, which dominates at real size (a real VAE's decode
and reward model add their own, the same for every method). An epoch is one caption's group of ``batch`` images,
rolled out in one batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch
from diffusers import ModelMixin

from dit_trainer.apps.gpu_check.assets import Assets
from dit_trainer.assemble import build_trainer
from dit_trainer.components.build import build_components
from dit_trainer.config import call_with_sections
from dit_trainer.precision import resolve_mixed_precision, weight_dtype
from dit_trainer.run_config import compose_train_config

# a Job's ``what`` for these rows -> the method's settings. Each trains 4 of the sampler's 10 steps per image, in
# updates of 64 rows at a group of 32 (GRPO: 8 trajectories x 4 steps x CFG's 2 halves; NFT: 16 images x 4), which
# fit an 80 GB GPU at PixArt-XL/2's ~0.5 GiB of activations per row. DiffusionNFT refuses an epsilon model (its loss
# would weigh the noisiest steps ~150x), so its row trains the DiT as a v-prediction one: the same work.
ONLINE_METHODS = {
    "grpo": ["grpo.sde_steps=4", "grpo.minibatches=4"],
    "nft": ["nft.steps_per_sample=4", "nft.minibatches=2", "diffusion.objective=v_prediction"],
}


def _with_assets(recipe: list[str], assets: Assets) -> list[str]:
    """``recipe`` (the row's quiet overrides) with the check's images (which no online method reads) and reward."""
    return [*recipe, f"data.path={assets.images}", "reward=clip_score", f"reward.clip_model={assets.clip}"]


def save_once(model: ModelMixin, folder: Path) -> None:
    """``model`` saved to ``folder``: written beside it and renamed into place, so that of a launch's processes the
    first rename wins and none reads a half-written one."""
    partial = folder.with_name(f".{folder.name}.partial-{torch.randint(10**9, ()).item()}")
    model.save_pretrained(partial)
    with contextlib.suppress(OSError):  # another process renamed its copy first
        partial.rename(folder)


def online_steps(recipe: list[str], assets: Assets, what: str, config_dir: Path, work: Path, name: str
                 ) -> tuple[str, Callable[[int, ExitStack], Callable[[], object]]]:  # fmt: skip
    """The recipe's mixed precision, and a maker of epochs for the timing loop: at a group size, the trainer of
    ``recipe`` fine-tuned by ``what`` from a random copy of its DiT (``work/random-<name>``, written once), closed
    with the stack it is given; each call of what it returns is one epoch (``trainer.step``)."""
    base = compose_train_config(config_dir, _with_assets(recipe, assets))
    precision = base.trainer.mixed_precision
    pretrained = work / f"random-{name}"
    if not pretrained.is_dir():
        dtype = weight_dtype(resolve_mixed_precision(precision))
        parts = call_with_sections(build_components, base, device=torch.device("cpu"), frozen_dtype=dtype)
        save_once(parts.dit.transformer, pretrained)

    def make(group: int, trainers: ExitStack) -> Callable[[], object]:
        method = [f"trainer.method={what}", f"{what}.prompts=[a red circle]", f"{what}.prompt_file=null",
                  f"{what}.prompts_per_epoch=1", f"{what}.group_size={group}", f"{what}.rollout_batch_size={group}",
                  f"model.pretrained={pretrained}", *ONLINE_METHODS[what]]  # fmt: skip
        cfg = compose_train_config(config_dir, [*_with_assets(recipe, assets), *method])
        trainer = trainers.enter_context(build_trainer(cfg, work / f"run-{name}-{what}-{group}"))
        prompts = trainer.step.batches()
        return lambda: trainer.step(prompts)

    return precision, make
