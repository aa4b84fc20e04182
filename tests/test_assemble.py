"""The composition root (``assemble.py``): what a step uses is where accelerate put the trained model, and a
collective waits long enough for the main process's monitors.

On a GPU, ``accelerator.prepare`` moves the DiT to the device; a module built from it before (a frozen copy) stays
on the CPU, and the first step that uses both fails there. On this CPU-only machine the meta device stands in for
the GPU: ``prepare`` is made to move the model there, and every module a step uses must have followed it.
"""

import math
from datetime import timedelta

import accelerate
import pytest
import torch

from dit_trainer import assemble
from dit_trainer.apps.inference import load_run
from dit_trainer.assemble import build_trainer
from dit_trainer.errors import ConfigError
from dit_trainer.training.launch import build_accelerator
from dit_trainer.training.state.training_state import DataPosition

from .conftest import GRPO_PROMPTS, SHAPES_TRANSFORMER, build_tiny_transformer, compose_config, read_metrics

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
    with build_trainer(cfg, tmp_path / "run") as trainer:
        assert devices(trainer.dit) == {"meta"}
        assert devices(trainer.step.reference.model) == {"meta"}


def test_the_collective_timeout_outlasts_a_long_monitor(tmp_path):
    """The main process samples and scores while the others wait in a collective: NCCL's 10 minutes by default."""
    cfg = compose_config(["+experiment=shapes", "trainer.collective_timeout_minutes=90"])
    assert build_accelerator(cfg.trainer, cfg.logger, tmp_path).init_handler.timeout == timedelta(minutes=90)


def test_a_run_trains_checkpoints_and_resumes_in_this_process(tmp_path, monkeypatch):
    """The smoke test of the whole core without a subprocess: ``build_trainer(cfg).fit()`` trains the DiT (its
    weights move, the frozen VAE's and text encoder's do not), logs finite losses, writes the config and a
    checkpoint, and a second build of the same run resumes at that step (and place in the data) and finishes the
    longer run. A resume that changes the model is refused before any model is built (it was refused once the
    models had loaded and the data had been encoded: minutes on a real model)."""
    overrides = ["+experiment=shapes", "data.length=32", "trainer.batch_size=8", "model.num_layers=1",
                 "trainer.sample_every=0", "trainer.log_every=1", "trainer.checkpoint_every=2",
                 "monitor.reward.enabled=false", "validation.every_n_steps=0"]  # fmt: skip
    trainer = build_trainer(compose_config([*overrides, "trainer.max_steps=2"]), tmp_path)
    dit = accelerate.Accelerator().unwrap_model(trainer.dit).transformer
    loss = trainer.step.loss_fn
    frozen = [*loss.vae.parameters(), *loss.text_encoder.parameters()]
    before = [p.detach().clone() for p in dit.parameters()], [p.detach().clone() for p in frozen]
    assert trainer.fit().steps == 2
    losses = [record["loss"] for record in read_metrics(tmp_path) if "loss" in record]
    assert len(losses) == 2 and all(map(math.isfinite, losses))
    assert not any(map(torch.equal, before[0], [p.detach() for p in dit.parameters()]))
    assert frozen and all(map(torch.equal, before[1], [p.detach() for p in frozen]))
    assert (tmp_path / "config.yaml").is_file() and (tmp_path / "checkpoints" / "checkpoint-2").is_dir()

    with monkeypatch.context() as patched:
        patched.setattr(assemble, "build_components", lambda **parts: pytest.fail("a model was built"))
        with pytest.raises(ConfigError, match=r"model.num_layers \(1 -> 2\)"):
            build_trainer(compose_config([*overrides, "trainer.max_steps=3", "trainer.resume=latest",
                                          "model.num_layers=2"]), tmp_path)  # fmt: skip
    resumed = build_trainer(compose_config([*overrides, "trainer.max_steps=3", "trainer.resume=latest"]), tmp_path)
    assert resumed.state.step == 2 and resumed.state.data_position == DataPosition(0, 2, 8, 8)  # 4 batches an epoch
    assert resumed.fit().steps == 3 and resumed.state.data_position == DataPosition(0, 3, 8, 8)


def test_lora_adapters_resume_only_on_the_base_they_trained_on(tmp_path, caplog):
    """A LoRA checkpoint holds the adapters alone: a base re-saved under the same path (or an unpinned hub id that
    moved on) was trained on by the resumed adapters, silently. The checkpoint records the base's fingerprint; the
    resume is refused before any model loads, and sampling says so."""
    base = tmp_path / "base"
    overrides = ["+experiment=shapes", "data.length=16", "trainer.batch_size=8", f"model.pretrained={base}",
                 "lora.enabled=true", "lora.rank=2", "trainer.sample_every=0", "trainer.checkpoint_every=1",
                 "monitor.reward.enabled=false", "validation.every_n_steps=0"]  # fmt: skip
    build_tiny_transformer(**SHAPES_TRANSFORMER, num_layers=1).transformer.save_pretrained(base)
    build_trainer(compose_config([*overrides, "trainer.max_steps=1"]), tmp_path / "run").fit()
    build_tiny_transformer(**SHAPES_TRANSFORMER, num_layers=1, seed=1).transformer.save_pretrained(base)
    with pytest.raises(ConfigError, match=r"adapters were trained on other weights than those now at `model.pretra"):
        build_trainer(compose_config([*overrides, "trainer.max_steps=2", "trainer.resume=latest"]), tmp_path / "run")
    load_run(tmp_path / "run")
    assert "trained on other base weights than those now at" in caplog.text


@pytest.mark.slow
def test_a_resume_in_smaller_batches_continues_at_the_image_it_stopped_at(tmp_path):
    """2 steps of 8 images, resumed with `trainer.batch_size=4`: the next batch is the epoch's 5th of 4 (images
    16-19), not its 3rd (the step count in the new batches would read images 8-15 again)."""
    overrides = ["+experiment=shapes", "data.length=32", "model.num_layers=1", "trainer.sample_every=0",
                 "monitor.reward.enabled=false", "validation.every_n_steps=0",
                 "trainer.checkpoint_every=2"]  # fmt: skip
    build_trainer(compose_config([*overrides, "trainer.max_steps=2", "trainer.batch_size=8"]), tmp_path).fit()
    resumed = compose_config([*overrides, "trainer.max_steps=3", "trainer.resume=latest", "trainer.batch_size=4"])
    trainer = build_trainer(resumed, tmp_path)
    assert trainer.fit().steps == 3 and trainer.state.data_position == DataPosition(0, 5, 4, 4)
