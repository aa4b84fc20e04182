"""The composition root (``assemble.py``): what a step uses is where accelerate put the trained model, and a
collective waits long enough for the main process's monitors.

On a GPU, ``accelerator.prepare`` moves the DiT to the device; a module built from it before (a frozen copy) stays
on the CPU, and the first step that uses both fails there. On this CPU-only machine the meta device stands in for
the GPU: ``prepare`` is made to move the model there, and every module a step uses must have followed it.
"""

from datetime import timedelta

import accelerate
import pytest
import torch

from dit_trainer.assemble import build_accelerator, build_trainer

from .conftest import GRPO_PROMPTS, SHAPES_TRANSFORMER, build_tiny_transformer, compose_config

META = torch.device("meta")


@pytest.fixture()
def prepare_moves_to_meta(monkeypatch):
    prepare_model = accelerate.Accelerator.prepare_model

    def to_meta(self, model, *args, **kwargs):
        return prepare_model(self, model, *args, **kwargs).to(META)

    monkeypatch.setattr(accelerate.Accelerator, "prepare_model", to_meta)


def devices(module: torch.nn.Module) -> set[str]:
    return {tensor.device.type for tensor in [*module.parameters(), *module.buffers()]}


def test_the_grpo_kl_reference_is_where_the_trained_model_is(tmp_path, prepare_moves_to_meta):
    """Full fine-tuning with ``grpo.beta > 0`` keeps a frozen copy of the starting weights: copied before
    ``prepare`` (as it once was), it stayed on the CPU while the policy went to the GPU."""
    build_tiny_transformer(**SHAPES_TRANSFORMER).transformer.save_pretrained(tmp_path / "base")
    cfg = compose_config(["+experiment=shapes_grpo", f"model.pretrained={tmp_path / 'base'}", GRPO_PROMPTS,
                          "grpo.prompt_file=null", "grpo.beta=0.1", "monitor.reward.enabled=false"])  # fmt: skip
    trainer = build_trainer(cfg, tmp_path / "run")
    try:
        assert devices(trainer.dit) == {"meta"}
        assert devices(trainer.step.reference.model) == {"meta"}
    finally:
        trainer.run_lock.release()


def test_the_collective_timeout_outlasts_a_long_monitor(tmp_path):
    """The main process samples and scores while the others wait in a collective: NCCL's 10 minutes by default."""
    cfg = compose_config(["+experiment=shapes", "trainer.collective_timeout_minutes=90"])
    assert build_accelerator(cfg, tmp_path).init_handler.timeout == timedelta(minutes=90)
